// ZeRO's optimizer step with its moments in files, and their way into and out of checkpoints.
#include "shardtrain/train.h"
#include "train/run_setup.h"

namespace shardtrain {

void Trainer::nvme_step(double lr) {
  torch::NoGradGuard no_grad;
  ++nvme_steps_;
  const AdamWStep hyper = AdamWStep()
                              .lr(lr)
                              .betas(config_.beta1, config_.beta2)
                              .eps(config_.eps)
                              .weight_decay(0.0)
                              .step(nvme_steps_);
  const auto shards = fsdp_->flat_shards();
  for (size_t u = 0; u < shards.size(); ++u) {
    const int unit = static_cast<int>(u);
    // With the parameter shards in files too, one unit's shard is in memory at a time.
    fsdp_->load_shards(unit);
    // AdamW's decoupled decay comes first and is elementwise, so applying it per piece and
    // then stepping the whole shard with no decay is the same update.
    if (config_.weight_decay != 0.0) {
      for (const auto& s : fsdp_->segments()) {
        if (s.unit == unit && s.shape.size() >= 2) s.param.mul_(1.0 - lr * config_.weight_decay);
      }
    }
    nvme_[u]->step(shards[u].first, shards[u].second, hyper);
    fsdp_->store_shards(unit);
  }
}

void Trainer::nvme_state_to_optimizer() {
  // Checkpoints read AdamW state per piece: materialize it from the files for the save.
  for (size_t u = 0; u < nvme_.size(); ++u) {
    const at::Tensor avg = nvme_[u]->exp_avg();
    const at::Tensor avg_sq = nvme_[u]->exp_avg_sq();
    for (const auto& s : fsdp_->segments()) {
      if (s.unit != static_cast<int>(u) || nvme_steps_ == 0) continue;
      auto state = std::make_unique<torch::optim::AdamWParamState>();
      state->step(nvme_steps_);
      state->exp_avg(avg.narrow(0, s.shard_offset, s.param.numel()).clone());
      state->exp_avg_sq(avg_sq.narrow(0, s.shard_offset, s.param.numel()).clone());
      optimizer_->state()[detail::optimizer_state_key(s.param)] = std::move(state);
    }
  }
}

void Trainer::nvme_state_from_optimizer() {
  // After a save or a load: the files hold the state again, the optimizer none.
  auto& states = optimizer_->state();
  for (size_t u = 0; u < nvme_.size(); ++u) {
    at::Tensor avg = at::zeros_like(fsdp_->flat_shards()[u].first);
    at::Tensor avg_sq = at::zeros_like(avg);
    for (const auto& s : fsdp_->segments()) {
      auto it = states.find(detail::optimizer_state_key(s.param));
      if (s.unit != static_cast<int>(u) || it == states.end()) continue;
      const auto& state = static_cast<const torch::optim::AdamWParamState&>(*it->second);
      avg.narrow(0, s.shard_offset, s.param.numel()).copy_(state.exp_avg());
      avg_sq.narrow(0, s.shard_offset, s.param.numel()).copy_(state.exp_avg_sq());
      nvme_steps_ = state.step();
      states.erase(it);
    }
    nvme_[u]->load(avg, avg_sq);
  }
}

}  // namespace shardtrain
