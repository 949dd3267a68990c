// The replicated strategies' ParallelModel: every data-parallel rank holds the whole model (or
// its tensor-parallel slices): parallel.strategy "none", and "ddp".
#pragma once

#include <memory>

#include "parallel/parallel_model.h"
#include "shardtrain/ddp.h"

namespace shardtrain {

// The ranks that hold a tensor, among which a checkpoint shares out its writing: this is `rank`
// of `size` ranks holding it whole (the world, or one pipeline stage's ranks), and `dp_rank` of
// `dp_size` data-parallel ranks holding the same tensor-parallel slice of it.
struct Holders {
  int rank = 0, size = 1, dp_rank = 0, dp_size = 1;
};

class ReplicatedModel : public ParallelModel {
 public:
  // `ddp`: null for "none" (or one data-parallel rank). `dense`: the holders of every tensor but
  // the experts'. Under expert parallelism (the model has an expert split) the experts'
  // parameters are `expert_ddp`'s (null: no other rank holds the same experts), held by
  // `experts`.
  ReplicatedModel(Transformer model, std::shared_ptr<ProcessGroup> world,
                  std::unique_ptr<DistributedDataParallel> ddp, Holders dense,
                  std::unique_ptr<DistributedDataParallel> expert_ddp, Holders experts,
                  std::string description);
  ~ReplicatedModel() override;

  std::vector<OptimizedTensor> optimized() const override;
  void zero_grad(torch::optim::Optimizer& optimizer) override {
    // Before each step: nothing of a backward that failed part-way (a replica lost) remains.
    if (ddp_) ddp_->abandon_backward();
    if (expert_ddp_) expert_ddp_->abandon_backward();
    optimizer.zero_grad();
  }
  ProcessGroup* keep_gradients_local(bool local) override {
    local_gradients_ = local;
    return ddp_ ? &ddp_->group() : nullptr;
  }
  void optimizer_step(torch::optim::AdamW& optimizer, double /*lr*/) override { optimizer.step(); }
  CheckpointContents checkpoint_contents(const torch::optim::AdamW& optimizer) override;
  void restore(const ShardedCheckpointReader& reader, torch::optim::AdamW& optimizer) override;
  std::unique_ptr<StageScope> hold_stage() override;
  double clip_grad_norm(double max_norm, ProcessGroup* stages) override;
  bool unscale_gradients(const LossScaler& scaler) override;
  bool finite_everywhere(bool local) override;

 protected:
  std::shared_ptr<void> local_backward(int a, int count) override;

 private:
  std::unique_ptr<DistributedDataParallel> ddp_, expert_ddp_;
  Holders dense_, experts_;
  bool local_gradients_ = false;  // keep_gradients_local
};

namespace detail {

struct TpState;

// The logical tensors of a trainer checkpoint, in order: every trained parameter under its
// module name (a LoRA run's adapters only), the buffers, then AdamW's state of each parameter
// that has one ("optim.NAME.exp_avg", ".exp_avg_sq", and ".step" as a 0-dim int64), each as the
// full tensor whatever the strategy, so that it reshards like the parameters.
NamedTensors logical_tensors(Transformer& model, const torch::optim::AdamW& optimizer);
// The state beyond AdamW's that `optimizer` keeps for `param` (1-bit LAMB's), as (suffix,
// tensor): written as "optim.NAME.<suffix>" and restored into the same tensors.
NamedTensors extra_optimizer_state(const torch::optim::AdamW& optimizer, const at::Tensor& param);

// The flat slices of `tensors` this rank writes under a replicated strategy: each of the
// holders.size ranks that hold every tensor whole writes shard_range(numel, size, rank) of
// each, so that all write in parallel. A tensor split by tensor parallelism (`tp`) is held
// whole by the data-parallel ranks of one group position: they share it the same way, and its
// slices are written as ranges of the whole tensor.
std::vector<FlatSlice> owned_slices(const Holders& holders, const TpState* tp,
                                    const NamedTensors& tensors);

}  // namespace detail
}  // namespace shardtrain
