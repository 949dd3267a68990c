// The names of the parallel strategies' kinds, as configs spell them, and their enums: what the
// config checks and the strategies take, with no strategy behind them.
#pragma once

#include <string>

namespace shardtrain {

// What is sharded, as PyTorch FSDP names it:
// - kFullShard: parameters, gradients and optimizer state; parameters gathered for each unit's
//   forward and again for its backward (ZeRO-3).
// - kShardGradOp: gradients and optimizer state; parameters stay gathered from a unit's forward
//   to the end of its backward (ZeRO-2 style).
// - kNoShard: nothing; gradients all-reduced (DDP semantics).
// - kHybridShard: kFullShard inside the mesh's dp_shard group, gradients all-reduced across the
//   dp_replicate group.
enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard };
// When the next unit's parameters are gathered during backward: when the current unit's
// backward starts (kBackwardPre, most overlap, one more unit in memory), after its gradients are
// reduced (kBackwardPost), or only when needed (kNone).
enum class BackwardPrefetch { kBackwardPre, kBackwardPost, kNone };

// Parses "full_shard", ..., and "backward_pre", ...; throws std::invalid_argument listing the
// valid names.
ShardingStrategy sharding_strategy_from_string(const std::string& name);
BackwardPrefetch backward_prefetch_from_string(const std::string& name);
std::string to_string(ShardingStrategy strategy);
std::string to_string(BackwardPrefetch prefetch);

enum class PipelineScheduleKind { kGpipe, kOneFOneB, kInterleaved1F1B, kZeroBubble };
std::string to_string(PipelineScheduleKind kind);
// "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"; throws std::invalid_argument listing them.
PipelineScheduleKind pipeline_schedule_from_string(const std::string& name);

}  // namespace shardtrain
