#include "shardtrain/parallel_names.h"

#include <stdexcept>
#include <utility>
#include <vector>

namespace shardtrain {
namespace {

template <typename E>
using Names = std::vector<std::pair<const char*, E>>;

template <typename E>
E from_name(const Names<E>& names, const std::string& name) {
  std::string known;
  for (const auto& [candidate, value] : names) {
    if (candidate == name) return value;
    known += (known.empty() ? "\"" : ", \"") + std::string(candidate) + "\"";
  }
  throw std::invalid_argument("\"" + name + "\" is not one of " + known);
}

template <typename E>
std::string name_of(const Names<E>& names, E value) {
  for (const auto& [name, candidate] : names) {
    if (candidate == value) return name;
  }
  return "unknown";
}

const Names<ParallelStrategy> kStrategies = {{"none", ParallelStrategy::kNone},
                                             {"ddp", ParallelStrategy::kDdp},
                                             {"fsdp", ParallelStrategy::kFsdp},
                                             {"zero", ParallelStrategy::kZero}};
const Names<ShardingStrategy> kShardings = {{"full_shard", ShardingStrategy::kFullShard},
                                            {"shard_grad_op", ShardingStrategy::kShardGradOp},
                                            {"no_shard", ShardingStrategy::kNoShard},
                                            {"hybrid_shard", ShardingStrategy::kHybridShard}};
const Names<BackwardPrefetch> kPrefetches = {{"backward_pre", BackwardPrefetch::kBackwardPre},
                                             {"backward_post", BackwardPrefetch::kBackwardPost},
                                             {"none", BackwardPrefetch::kNone}};
const Names<FsdpWrap> kWraps = {
    {"block", FsdpWrap::kBlock}, {"size", FsdpWrap::kSize}, {"class", FsdpWrap::kClass}};
const Names<OffloadDevice> kOffloads = {
    {"none", OffloadDevice::kNone}, {"cpu", OffloadDevice::kCpu}, {"nvme", OffloadDevice::kNvme}};
const Names<DDPCommHook> kCommHooks = {{"none", DDPCommHook::kNone},
                                       {"bf16", DDPCommHook::kBf16Compress},
                                       {"fp16", DDPCommHook::kFp16Compress}};
const Names<PipelineScheduleKind> kSchedules = {
    {"gpipe", PipelineScheduleKind::kGpipe},
    {"1f1b", PipelineScheduleKind::kOneFOneB},
    {"interleaved_1f1b", PipelineScheduleKind::kInterleaved1F1B},
    {"zero_bubble", PipelineScheduleKind::kZeroBubble}};

}  // namespace

ParallelStrategy parallel_strategy_from_string(const std::string& name) {
  return from_name(kStrategies, name);
}
ShardingStrategy sharding_strategy_from_string(const std::string& name) {
  return from_name(kShardings, name);
}
BackwardPrefetch backward_prefetch_from_string(const std::string& name) {
  return from_name(kPrefetches, name);
}
FsdpWrap fsdp_wrap_from_string(const std::string& name) { return from_name(kWraps, name); }
OffloadDevice offload_device_from_string(const std::string& name) {
  return from_name(kOffloads, name);
}
DDPCommHook ddp_comm_hook_from_string(const std::string& name) {
  return from_name(kCommHooks, name);
}
PipelineScheduleKind pipeline_schedule_from_string(const std::string& name) {
  return from_name(kSchedules, name);
}

std::string to_string(ParallelStrategy strategy) { return name_of(kStrategies, strategy); }
std::string to_string(ShardingStrategy strategy) { return name_of(kShardings, strategy); }
std::string to_string(BackwardPrefetch prefetch) { return name_of(kPrefetches, prefetch); }
std::string to_string(FsdpWrap wrap) { return name_of(kWraps, wrap); }
std::string to_string(OffloadDevice device) { return name_of(kOffloads, device); }
std::string to_string(DDPCommHook hook) { return name_of(kCommHooks, hook); }
std::string to_string(PipelineScheduleKind kind) { return name_of(kSchedules, kind); }

}  // namespace shardtrain
