// The parallel strategies and their kinds as enums, with the names configs spell them by: what
// the config parses once and the strategies take, with no strategy behind them.
#pragma once

#include <string>

namespace shardtrain {

// parallel.strategy: one process, replicas (DistributedDataParallel), FSDP, or DeepSpeed's ZeRO.
enum class ParallelStrategy { kNone, kDdp, kFsdp, kZero };

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
// parallel.fsdp.wrap: one unit per transformer block, units of at least fsdp.min_params
// parameters, or units at the modules of the named classes.
enum class FsdpWrap { kBlock, kSize, kClass };

// Where ZeRO keeps optimizer state or parameter shards: device memory, host memory, or files.
enum class OffloadDevice { kNone, kCpu, kNvme };

// How a DDP bucket travels: as is, or compressed to a 16-bit float for the all-reduce (half the
// bytes; the average is taken in that precision and copied back into the fp32 gradients).
enum class DDPCommHook { kNone, kBf16Compress, kFp16Compress };

enum class PipelineScheduleKind { kGpipe, kOneFOneB, kInterleaved1F1B, kZeroBubble };

// The names, as a config writes them:
// - ParallelStrategy: "none", "ddp", "fsdp", "zero";
// - ShardingStrategy: "full_shard", "shard_grad_op", "no_shard", "hybrid_shard";
// - BackwardPrefetch: "backward_pre", "backward_post", "none";
// - FsdpWrap: "block", "size", "class";
// - OffloadDevice: "none", "cpu", "nvme";
// - DDPCommHook: "none", "bf16", "fp16";
// - PipelineScheduleKind: "gpipe", "1f1b", "interleaved_1f1b", "zero_bubble".
// Each *_from_string throws std::invalid_argument: "\"NAME\" is not one of \"a\", \"b\", ...".
ParallelStrategy parallel_strategy_from_string(const std::string& name);
ShardingStrategy sharding_strategy_from_string(const std::string& name);
BackwardPrefetch backward_prefetch_from_string(const std::string& name);
FsdpWrap fsdp_wrap_from_string(const std::string& name);
OffloadDevice offload_device_from_string(const std::string& name);
DDPCommHook ddp_comm_hook_from_string(const std::string& name);
PipelineScheduleKind pipeline_schedule_from_string(const std::string& name);
std::string to_string(ParallelStrategy strategy);
std::string to_string(ShardingStrategy strategy);
std::string to_string(BackwardPrefetch prefetch);
std::string to_string(FsdpWrap wrap);
std::string to_string(OffloadDevice device);
std::string to_string(DDPCommHook hook);
std::string to_string(PipelineScheduleKind kind);

}  // namespace shardtrain
