// ZeRO's optimizer step with its moments in files, and their way back into the files after a
// checkpoint is loaded (saving streams them: Trainer::streamed_slices).
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
    fsdp_->prefetch_shards(unit + 1);  // read while this unit steps
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

void Trainer::nvme_state_from_optimizer() {
  // After a load: the files hold the state again, the optimizer none.
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
