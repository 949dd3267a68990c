// The trainer's FSDP and ZeRO setup, and ZeRO's optimizer step with its moments in files.
#include <cstdlib>

#include "shardtrain/train.h"
#include "train/run_setup.h"

namespace shardtrain {

void Trainer::setup_fsdp() {
  auto dtype = [](const std::string& name) { return name == "bf16" ? at::kBFloat16 : at::kFloat; };
  const MixedPrecision precision = MixedPrecision()
                                       .param_dtype(dtype(config_.param_dtype))
                                       .reduce_dtype(dtype(config_.reduce_dtype))
                                       .buffer_dtype(dtype(config_.buffer_dtype));
  if (config_.strategy == "zero") {
    mesh_ = std::make_unique<DeviceMesh>(world_, resolve_mesh(MeshShape(), world_size()));
    ZeroBehaviour knobs;
    knobs.overlap_comm = config_.zero_overlap_comm;
    knobs.reduce_bucket_size = config_.zero_reduce_bucket_size;
    knobs.allgather_bucket_size = config_.zero_allgather_bucket_size;
    knobs.prefetch_bucket_size = config_.zero_prefetch_bucket_size;
    knobs.persistence_threshold = config_.zero_param_persistence_threshold;
    knobs.max_live_parameters = config_.zero_max_live_parameters;
    fsdp_ = zero_shard(model_, *mesh_,
                       ZeroOptions()
                           .stage(static_cast<int>(config_.zero_stage))
                           .offload_optimizer(offload_device_from_string(config_.zero_offload_optimizer))
                           .offload_param(offload_device_from_string(config_.zero_offload_param))
                           .nvme_path(config_.zero_nvme_path)
                           .behaviour(knobs)
                           .mixed_precision(precision));
    return;
  }
  const auto sharding = sharding_strategy_from_string(config_.fsdp_sharding);
  int replicate = 1;
  if (sharding == ShardingStrategy::kHybridShard) {
    replicate = static_cast<int>(config_.fsdp_replicate);
    if (replicate == 0) {
      // One replica per node, sharding inside it, as PyTorch's hybrid_shard does.
      const char* local = std::getenv("LOCAL_WORLD_SIZE");
      const int per_node = local ? std::atoi(local) : 0;
      if (per_node <= 0 || world_size() % per_node != 0 || world_size() == per_node) {
        throw std::invalid_argument(
            "parallel.fsdp.sharding = \"hybrid_shard\" needs parallel.fsdp.replicate (the "
            "dp_replicate size) when the ranks are not on several nodes");
      }
      replicate = world_size() / per_node;
    }
  }
  mesh_ = std::make_unique<DeviceMesh>(world_, resolve_mesh(MeshShape().dp_replicate(replicate),
                                                            world_size()));
  WrapPolicy wrap = config_.fsdp_wrap == "size"    ? WrapPolicy::size(config_.fsdp_min_params)
                    : config_.fsdp_wrap == "class" ? WrapPolicy::class_name(config_.fsdp_wrap_classes)
                                                   : WrapPolicy::blocks();
  fsdp_ = fully_shard(model_, *mesh_,
                      FSDPOptions()
                          .sharding(sharding)
                          .wrap(wrap)
                          .backward_prefetch(backward_prefetch_from_string(config_.fsdp_prefetch))
                          .forward_prefetch(config_.fsdp_forward_prefetch)
                          .limit_all_gathers(static_cast<int>(config_.fsdp_limit_all_gathers))
                          .cpu_offload(config_.fsdp_cpu_offload)
                          .mixed_precision(precision));
}

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
