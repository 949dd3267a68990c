#include "parallel/fsdp/sharded_model.h"

#include <set>

#include "model/names.h"
#include "parallel/expert/expert_parallel.h"
#include "parallel/tensor/tp_state.h"

namespace shardtrain {
namespace {

class HeldStage : public StageScope {
 public:
  HeldStage(FullyShardedDataParallel* fsdp, ProcessGroup* dp) : gathered_(fsdp), dp_(dp) {}
  void reduce(const std::function<void(ProcessGroup*)>& sum_tied) override {
    // The tied copies' whole gradients are averaged and summed before the reduction, which
    // leaves each rank only its shard (the two stages' shards do not line up); the reduction
    // then averages values equal on every rank, in any order the same bits on both stages.
    sum_tied(dp_);
    gathered_.reduce_gradients();
  }

 private:
  detail::GatheredStage gathered_;
  ProcessGroup* dp_;
};

}  // namespace

ShardedModel::ShardedModel(Transformer model, std::shared_ptr<ProcessGroup> world,
                           std::unique_ptr<FullyShardedDataParallel> fsdp, ProcessGroup* dp,
                           std::string description)
    : ParallelModel(std::move(model), std::move(world), std::move(description)),
      fsdp_(std::move(fsdp)),
      dp_(dp) {}

ShardedModel::~ShardedModel() = default;

std::vector<OptimizedTensor> ShardedModel::optimized() const {
  // This rank's pieces of the parameters.
  std::vector<OptimizedTensor> out;
  for (const auto& s : fsdp_->segments()) out.push_back({s.param, s.shape.size() >= 2});
  return out;
}

void ShardedModel::zero_grad(torch::optim::Optimizer& /*optimizer*/) {
  fsdp_->zero_grad();  // the optimizer's gradients are views into the shards
  fsdp_->reset_peak();
}

void ShardedModel::optimizer_step(torch::optim::AdamW& optimizer, double /*lr*/) {
  fsdp_->load_shards();  // parameter shards kept in files
  optimizer.step();
  fsdp_->after_optimizer_step();
}

bool ShardedModel::unscale_gradients(const LossScaler& scaler) {
  if (scaler.enabled()) fsdp_->unscale(scaler.scale());
  return fsdp_->grads_finite();
}

double ShardedModel::clip_grad_norm(double max_norm, ProcessGroup* stages) {
  std::set<std::string> tied_copy;  // a pipeline's last stage counts no tied embedding
  if (detail::is_tied_head_copy(*model_, "tok_emb.weight")) tied_copy.insert("tok_emb.weight");
  return fsdp_->clip_grad_norm(max_norm, stages, tied_copy);
}

std::unique_ptr<StageScope> ShardedModel::hold_stage() {
  return std::make_unique<HeldStage>(fsdp_.get(), dp_);
}

void ShardedModel::model_specs(CheckpointContents& out, bool has_state) {
  const auto trained = detail::trained_parameters(model_);
  const detail::TpState* tp = detail::tp_state(model_).get();
  for (const auto& [name, value] : trained) {
    out.specs.push_back({name, detail::whole_shape(tp, name, value.sizes()), at::kFloat});
  }
  for (const auto& item : model_->named_buffers()) {
    out.specs.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type()});
    if (world_->rank() == 0) {
      out.slices.push_back({item.key(), 0, item.value().detach().reshape({-1})});
    }
  }
  if (has_state) {
    for (const auto& [name, value] : trained) {
      detail::add_adam_specs(out.specs, name, detail::whole_shape(tp, name, value.sizes()));
    }
  }
  // Under expert parallelism every rank lists every expert.
  if (model_->expert_split()) {
    out.specs = detail::with_every_expert(out.specs, model_->config().n_experts);
  }
}

CheckpointContents ShardedModel::checkpoint_contents(const torch::optim::AdamW& optimizer) {
  // Parameter shards kept in files: in memory until the save is done (not the gradients).
  fsdp_->load_shards(-1, /*gradients=*/false);
  // The same logical tensors as the replicated strategies write (fp32 parameters, AdamW state
  // whole), as the pieces of them this rank's shards hold. Ranks of other replicas hold the
  // same pieces and write none of them.
  CheckpointContents out;
  const auto& segments = fsdp_->segments();
  bool has_state = false;
  for (const auto& s : segments) has_state = has_state || detail::adam_state(optimizer, s.param);
  has_state = detail::on_any_rank(*world_, has_state);
  model_specs(out, has_state);
  // Split by tensor parallelism, a rank writes its slices as ranges of the whole tensor; what
  // is replicated across the group is written by the group's first rank.
  const detail::TpState* tp = detail::tp_state(model_).get();
  auto add = [&](const FlatSlice& local) {
    for (auto& slice : detail::whole_slices(tp, local)) out.slices.push_back(std::move(slice));
  };
  for (const auto& s : segments) {
    if (!s.unique) continue;
    const bool split = tp && tp->layout_of(s.name);
    if (tp && !split && tp->rank() != 0) continue;
    if (detail::is_tied_head_copy(*model_, s.name)) continue;  // the first stage writes it
    add({s.name, s.offset, s.param.detach()});
    if (!has_state) continue;
    const auto* state = detail::adam_state(optimizer, s.param);
    TORCH_CHECK(state, "checkpoint: no AdamW state for a piece of ", s.name);
    add({"optim." + s.name + ".exp_avg", s.offset, state->exp_avg()});
    add({"optim." + s.name + ".exp_avg_sq", s.offset, state->exp_avg_sq()});
    // The scalar step belongs to whichever rank holds the parameter's first element.
    if (s.offset == 0 && (!tp || tp->rank() == 0)) {
      out.slices.push_back({"optim." + s.name + ".step", 0,
                            at::scalar_tensor(state->step(), at::kLong).reshape({1})});
    }
  }
  return out;
}

void ShardedModel::restore(const ShardedCheckpointReader& reader, torch::optim::AdamW& optimizer) {
  torch::NoGradGuard no_grad;
  restore_shards(reader, optimizer);
  for (const auto& item : model_->named_buffers()) item.value().copy_(reader.read(item.key()));
  fsdp_->after_optimizer_step();
}

void ShardedModel::restore_shards(const ShardedCheckpointReader& reader,
                                  torch::optim::AdamW& optimizer) {
  fsdp_->load_shards(-1, /*gradients=*/false);  // after_optimizer_step writes them back
  const detail::TpState* tp = detail::tp_state(model_).get();
  for (const auto& s : fsdp_->segments()) {
    detail::read_local_into(reader, tp, s.name, s.offset, s.param.detach());
    const std::string prefix = "optim." + s.name;
    if (!reader.find(prefix + ".exp_avg")) continue;
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->exp_avg(at::zeros({s.param.numel()}, at::kFloat));
    state->exp_avg_sq(at::zeros({s.param.numel()}, at::kFloat));
    detail::read_local_into(reader, tp, prefix + ".exp_avg", s.offset, state->exp_avg());
    detail::read_local_into(reader, tp, prefix + ".exp_avg_sq", s.offset, state->exp_avg_sq());
    state->step(reader.read(prefix + ".step").item<int64_t>());
    optimizer.state()[detail::optimizer_state_key(s.param)] = std::move(state);
  }
}

void ShardedModel::add_metrics(nlohmann::json& line) const {
  // Shards as allocated (with padding) plus whole parameters that stay gathered (ZeRO-1/2),
  // and the full parameters gathered at the step's peak.
  const FSDPMemory m = fsdp_->memory();
  line["mem"]["params"] = m.param_shards + m.resident_full;
  line["mem"]["grads"] = m.grad_shards;
  line["mem"]["gathered_peak"] = m.gathered_peak;
  if (fsdp_->shards_on_file()) line["mem"]["params_on_file"] = m.param_shards_on_file;
  if (m.grad_shards_on_file > 0) line["mem"]["grads_on_file"] = m.grad_shards_on_file;
}

std::string ShardedModel::progress_note() const {
  const FSDPMemory m = fsdp_->memory();
  char text[96];
  std::snprintf(text, sizeof(text), " | shards %.1f MiB, gathered peak %.1f MiB",
                static_cast<double>(m.param_shards + m.grad_shards) / (1 << 20),
                static_cast<double>(m.gathered_peak) / (1 << 20));
  return text;
}

}  // namespace shardtrain
