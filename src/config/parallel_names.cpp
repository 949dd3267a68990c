#include "shardtrain/parallel_names.h"

#include <stdexcept>
#include <utility>
#include <vector>

namespace shardtrain {
namespace {

const std::vector<std::pair<std::string, PipelineScheduleKind>>& schedule_names() {
  static const std::vector<std::pair<std::string, PipelineScheduleKind>> names = {
      {"gpipe", PipelineScheduleKind::kGpipe},
      {"1f1b", PipelineScheduleKind::kOneFOneB},
      {"interleaved_1f1b", PipelineScheduleKind::kInterleaved1F1B},
      {"zero_bubble", PipelineScheduleKind::kZeroBubble}};
  return names;
}

}  // namespace

ShardingStrategy sharding_strategy_from_string(const std::string& name) {
  if (name == "full_shard") return ShardingStrategy::kFullShard;
  if (name == "shard_grad_op") return ShardingStrategy::kShardGradOp;
  if (name == "no_shard") return ShardingStrategy::kNoShard;
  if (name == "hybrid_shard") return ShardingStrategy::kHybridShard;
  throw std::invalid_argument("unknown FSDP sharding strategy '" + name +
                              "' (expected full_shard, shard_grad_op, no_shard or hybrid_shard)");
}

BackwardPrefetch backward_prefetch_from_string(const std::string& name) {
  if (name == "backward_pre") return BackwardPrefetch::kBackwardPre;
  if (name == "backward_post") return BackwardPrefetch::kBackwardPost;
  if (name == "none") return BackwardPrefetch::kNone;
  throw std::invalid_argument("unknown FSDP backward prefetch '" + name +
                              "' (expected backward_pre, backward_post or none)");
}

std::string to_string(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard:
      return "full_shard";
    case ShardingStrategy::kShardGradOp:
      return "shard_grad_op";
    case ShardingStrategy::kNoShard:
      return "no_shard";
    case ShardingStrategy::kHybridShard:
      return "hybrid_shard";
  }
  return "?";
}

std::string to_string(BackwardPrefetch prefetch) {
  switch (prefetch) {
    case BackwardPrefetch::kBackwardPre:
      return "backward_pre";
    case BackwardPrefetch::kBackwardPost:
      return "backward_post";
    case BackwardPrefetch::kNone:
      return "none";
  }
  return "?";
}

std::string to_string(PipelineScheduleKind kind) {
  for (const auto& [name, value] : schedule_names()) {
    if (value == kind) return name;
  }
  return "unknown";
}

PipelineScheduleKind pipeline_schedule_from_string(const std::string& name) {
  std::string known;
  for (const auto& [candidate, value] : schedule_names()) {
    if (candidate == name) return value;
    known += (known.empty() ? "" : ", ") + ("\"" + candidate + "\"");
  }
  throw std::invalid_argument("parallel.pp_schedule \"" + name + "\" is not one of " + known);
}

}  // namespace shardtrain
