// The sharded strategies' ParallelModel: FSDP at any sharding, and ZeRO at any stage with its
// state in memory (zero/nvme_sharded_model.h: with the optimizer's state in files).
#pragma once

#include <memory>
#include <utility>

#include "parallel/parallel_model.h"
#include "shardtrain/fsdp.h"

namespace shardtrain {

class ShardedModel : public ParallelModel {
 public:
  // `dp`: the data-parallel ranks' group (the mesh's), which a pipeline's tied embedding's copies
  // are averaged over before its reduction.
  ShardedModel(Transformer model, std::shared_ptr<ProcessGroup> world,
               std::unique_ptr<FullyShardedDataParallel> fsdp, ProcessGroup* dp,
               std::string description);
  ~ShardedModel() override;

  std::vector<OptimizedTensor> optimized() const override;
  void zero_grad(torch::optim::Optimizer& optimizer) override;
  void abandon_pass() override { fsdp_->abandon_pass(); }
  void optimizer_step(torch::optim::AdamW& optimizer, double lr) override;
  CheckpointContents checkpoint_contents(const torch::optim::AdamW& optimizer) override;
  void after_save() override { fsdp_->store_shards(); }
  void restore(const ShardedCheckpointReader& reader, torch::optim::AdamW& optimizer) override;
  bool forward_is_collective() const override { return true; }
  void add_metrics(nlohmann::json& line) const override;
  std::string progress_note() const override;
  std::unique_ptr<StageScope> hold_stage() override;
  double clip_grad_norm(double max_norm, ProcessGroup* stages) override;
  // Over its data-parallel and tensor-parallel ranks already.
  bool unscale_gradients(const LossScaler& scaler) override;

 protected:
  // restore()'s shards and AdamW's moments, each rank reading only the ranges its shards hold.
  virtual void restore_shards(const ShardedCheckpointReader& reader,
                              torch::optim::AdamW& optimizer);
  // The specs of what a sharded checkpoint holds (fp32 parameters, buffers, with `has_state`
  // AdamW's state), and rank 0's slices of the buffers.
  void model_specs(CheckpointContents& out, bool has_state);

  std::unique_ptr<FullyShardedDataParallel> fsdp_;

 private:
  ProcessGroup* dp_;
};

namespace detail {

// A pipeline stage under FSDP/ZeRO: its units gathered for the scope
// (FullyShardedDataParallel::begin_pipeline), freed at its end without reducing anything
// (evaluation, generation, a step that failed) unless reduce_gradients() ended it first.
class GatheredStage {
 public:
  explicit GatheredStage(FullyShardedDataParallel* fsdp) : fsdp_(fsdp) { fsdp_->begin_pipeline(); }
  ~GatheredStage() {
    try {
      if (fsdp_) fsdp_->end_pipeline(/*gradients=*/false);
    } catch (const std::exception&) {
      // a gather failed with the group: the error on its way out says so
    }
  }
  // A training step's end: the accumulated gradients reduced. Collective.
  void reduce_gradients() {
    if (FullyShardedDataParallel* fsdp = std::exchange(fsdp_, nullptr)) fsdp->end_pipeline();
  }
  GatheredStage(const GatheredStage&) = delete;
  GatheredStage& operator=(const GatheredStage&) = delete;

 private:
  FullyShardedDataParallel* fsdp_;
};

}  // namespace detail
}  // namespace shardtrain
