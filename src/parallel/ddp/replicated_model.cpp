#include "parallel/ddp/replicated_model.h"

#include <optional>

#include "model/names.h"
#include "parallel/expert/expert_parallel.h"
#include "parallel/tensor/tp_state.h"
#include "shardtrain/optimizers.h"
#include "shardtrain/tensor_parallel.h"

namespace shardtrain {
namespace {

// DDP's gradients held back over a pipeline's schedule, all-reduced once at its end (the
// experts' on their own group).
class HeldReduction : public StageScope {
 public:
  HeldReduction(DistributedDataParallel* ddp, DistributedDataParallel* expert_ddp)
      : ddp_(ddp), expert_ddp_(expert_ddp) {
    if (ddp_) local_only_.emplace(*ddp_);
    if (expert_ddp_) experts_local_only_.emplace(*expert_ddp_);
  }
  void reduce(const std::function<void(ProcessGroup*)>& sum_tied) override {
    local_only_.reset();
    experts_local_only_.reset();
    // Averaged over the data-parallel ranks first: the two copies' averages are then added in
    // one addition, which commutes, so both copies get the same bits (summed first, each
    // stage's all-reduce would add in its own order).
    if (ddp_) ddp_->all_reduce_gradients();
    if (expert_ddp_) expert_ddp_->all_reduce_gradients();
    sum_tied(nullptr);
  }

 private:
  DistributedDataParallel *ddp_, *expert_ddp_;
  std::optional<DistributedDataParallel::NoSync> local_only_, experts_local_only_;
};

// A pipeline's last stage holds the tied token embedding (or its optimizer state) as a copy:
// the first stage's is written for both.
bool is_tied_copy(const Transformer& model, const std::string& tensor) {
  const std::string prefix = "optim.";
  const bool state = tensor.rfind(prefix, 0) == 0;
  const std::string parameter =
      state ? tensor.substr(prefix.size(), tensor.rfind('.') - prefix.size()) : tensor;
  return detail::is_tied_head_copy(*model, parameter);
}

}  // namespace

NamedTensors detail::extra_optimizer_state(const torch::optim::AdamW& optimizer,
                                           const at::Tensor& param) {
  // The optimizer's own tensors: a checkpoint writes and restores them in place.
  auto* extra = dynamic_cast<const CompressedMomentumOptimizer*>(&optimizer);
  return extra ? extra->extra_state(param) : NamedTensors{};
}

NamedTensors detail::logical_tensors(Transformer& model, const torch::optim::AdamW& optimizer) {
  NamedTensors tensors;
  const auto trained = trained_parameters(model);
  for (const auto& [name, value] : trained) tensors.emplace_back(name, value);
  for (const auto& item : model->named_buffers()) tensors.emplace_back(item.key(), item.value());
  for (const auto& [key, value] : trained) {
    const auto* state = adam_state(optimizer, value);
    if (!state) continue;
    tensors.emplace_back("optim." + key + ".exp_avg", state->exp_avg());
    tensors.emplace_back("optim." + key + ".exp_avg_sq", state->exp_avg_sq());
    tensors.emplace_back("optim." + key + ".step", at::scalar_tensor(state->step(), at::kLong));
    for (const auto& [suffix, tensor] : detail::extra_optimizer_state(optimizer, value)) {
      tensors.emplace_back("optim." + key + "." + suffix, tensor);
    }
  }
  return tensors;
}

std::vector<FlatSlice> detail::owned_slices(const Holders& holders, const TpState* tp,
                                            const NamedTensors& tensors) {
  std::vector<FlatSlice> slices;
  for (const auto& [name, tensor] : tensors) {
    const bool split = tp && tp->layout_of(name);
    const ShardRange range = shard_range(tensor.numel(), split ? holders.dp_size : holders.size,
                                         split ? holders.dp_rank : holders.rank);
    if (range.numel == 0) continue;
    const FlatSlice local{name, range.offset,
                          tensor.detach().reshape({-1}).narrow(0, range.offset, range.numel)};
    for (auto& slice : detail::whole_slices(tp, local)) slices.push_back(std::move(slice));
  }
  return slices;
}

ReplicatedModel::ReplicatedModel(Transformer model, std::shared_ptr<ProcessGroup> world,
                                 std::unique_ptr<DistributedDataParallel> ddp, Holders dense,
                                 std::unique_ptr<DistributedDataParallel> expert_ddp,
                                 Holders experts, std::string description)
    : ParallelModel(std::move(model), std::move(world), std::move(description)),
      ddp_(std::move(ddp)),
      expert_ddp_(std::move(expert_ddp)),
      dense_(dense),
      experts_(experts) {}

ReplicatedModel::~ReplicatedModel() = default;

std::vector<OptimizedTensor> ReplicatedModel::optimized() const {
  std::vector<OptimizedTensor> out;
  for (const auto& p : model_->parameters()) {
    if (p.requires_grad()) out.push_back({p, p.dim() >= 2});  // not a LoRA run's frozen base
  }
  return out;
}

std::shared_ptr<void> ReplicatedModel::local_backward(int a, int count) {
  // Only the last micro-batch's backward communicates (none while the gradients stay local).
  if (a + 1 == count && !local_gradients_) return nullptr;
  struct Both {
    std::optional<DistributedDataParallel::NoSync> dense, experts;
  };
  auto guard = std::make_shared<Both>();
  if (ddp_) guard->dense.emplace(*ddp_);
  if (expert_ddp_) guard->experts.emplace(*expert_ddp_);
  return guard;
}

std::unique_ptr<StageScope> ReplicatedModel::hold_stage() {
  return std::make_unique<HeldReduction>(ddp_.get(), expert_ddp_.get());
}

bool ReplicatedModel::unscale_gradients(const LossScaler& scaler) {
  return scaler.unscale(parameters());
}

bool ReplicatedModel::finite_everywhere(bool local) {
  // Each rank checked its own slices (and experts, or its own gradients): every rank agrees.
  if (model_->expert_split() || (local_gradients_ && ddp_))
    return !detail::on_any_rank(*world_, !local);
  const auto& tp = detail::tp_state(model_);
  return tp ? !detail::on_any_rank(*tp->group, !local) : local;
}

double ReplicatedModel::clip_grad_norm(double max_norm, ProcessGroup* stages) {
  return detail::tp_state(model_) || stages || model_->expert_split()
             ? shardtrain::clip_grad_norm(model_, max_norm, stages)
             : shardtrain::clip_grad_norm(parameters(), max_norm);
}

CheckpointContents ReplicatedModel::checkpoint_contents(const torch::optim::AdamW& optimizer) {
  CheckpointContents out;
  NamedTensors tensors;
  for (auto& [name, tensor] : detail::logical_tensors(model_, optimizer)) {
    if (!is_tied_copy(model_, name)) tensors.emplace_back(name, tensor);
  }
  const detail::TpState* tp = detail::tp_state(model_).get();
  for (const auto& [name, tensor] : tensors) {
    out.specs.push_back(
        {name, detail::whole_shape(tp, name, tensor.sizes()), tensor.scalar_type()});
  }
  if (!model_->expert_split()) {
    out.slices = detail::owned_slices(dense_, tp, tensors);
    return out;
  }
  // Every rank lists every expert; the ranks holding an expert share out its writing.
  out.specs = detail::with_every_expert(out.specs, model_->config().n_experts);
  NamedTensors dense, experts;
  for (auto& item : tensors)
    (detail::is_expert_tensor(item.first) ? experts : dense).push_back(item);
  out.slices = detail::owned_slices(dense_, tp, dense);
  for (auto& slice : detail::owned_slices(experts_, tp, experts)) out.slices.push_back(slice);
  return out;
}

void ReplicatedModel::restore(const ShardedCheckpointReader& reader,
                              torch::optim::AdamW& optimizer) {
  // The module's own tensors are read into; AdamW state is created for the parameters the
  // checkpoint has state for, then filled.
  const auto trained = detail::trained_parameters(model_);
  NamedTensors targets = trained;
  for (const auto& item : model_->named_buffers()) targets.emplace_back(item.key(), item.value());
  std::vector<std::pair<at::Tensor, at::Tensor>> steps;  // parameter, its step read back
  for (const auto& [name, value] : trained) {
    const std::string prefix = "optim." + name;
    if (!reader.find(prefix + ".exp_avg")) continue;
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->exp_avg(at::zeros_like(value));
    state->exp_avg_sq(at::zeros_like(value));
    at::Tensor step = at::zeros({}, at::kLong);
    targets.emplace_back(prefix + ".exp_avg", state->exp_avg());
    targets.emplace_back(prefix + ".exp_avg_sq", state->exp_avg_sq());
    targets.emplace_back(prefix + ".step", step);
    steps.emplace_back(value, step);
    optimizer.state()[detail::optimizer_state_key(value)] = std::move(state);
    // 1-bit LAMB's own state, where the checkpoint has it (one written by another optimizer
    // leaves its starting values).
    for (const auto& [suffix, tensor] : detail::extra_optimizer_state(optimizer, value)) {
      if (reader.find(prefix + "." + suffix)) targets.emplace_back(prefix + "." + suffix, tensor);
    }
  }
  {
    torch::NoGradGuard no_grad;
    const detail::TpState* tp = detail::tp_state(model_).get();
    for (const auto& [name, target] : targets) {
      if (tp && tp->layout_of(name)) {
        detail::read_local_into(reader, tp, name, 0, target.view({-1}));
      } else {
        target.copy_(reader.read(name));
      }
    }
  }
  for (const auto& [param, step] : steps) {
    auto* state = static_cast<torch::optim::AdamWParamState*>(
        optimizer.state().at(detail::optimizer_state_key(param)).get());
    state->step(step.item<int64_t>());
  }
}

}  // namespace shardtrain
