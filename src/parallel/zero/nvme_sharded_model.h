// ZeRO with its optimizer state in files (offload_optimizer = "nvme", ZeRO-Infinity): each
// unit's AdamW moments live in files, one unit's in memory at a time, in the step, in a
// checkpoint's save (streamed as it is written) and in its restore.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/fsdp/sharded_model.h"
#include "shardtrain/fused_adamw.h"

namespace shardtrain {

class NvmeShardedModel : public ShardedModel {
 public:
  // The moments' files go under `dir` (parallel.zero.nvme_path).
  NvmeShardedModel(Transformer model, std::shared_ptr<ProcessGroup> world,
                   std::unique_ptr<FullyShardedDataParallel> fsdp, ProcessGroup* dp,
                   const std::string& dir, std::string description);
  ~NvmeShardedModel() override;

  // The trainer's AdamW holds no state here: its options (betas, eps, weight decay) are used.
  void optimizer_step(torch::optim::AdamW& optimizer, double lr) override;
  CheckpointContents checkpoint_contents(const torch::optim::AdamW& optimizer) override;

 protected:
  void restore_shards(const ShardedCheckpointReader& reader,
                      torch::optim::AdamW& optimizer) override;

 private:
  std::vector<std::unique_ptr<NvmeAdamW>> nvme_;  // one per unit shard
  int64_t steps_ = 0;
};

}  // namespace shardtrain
