#include "parallel/zero/nvme_sharded_model.h"

#include "model/init.h"

namespace shardtrain {

NvmeShardedModel::NvmeShardedModel(Transformer model, std::shared_ptr<ProcessGroup> world,
                                   std::unique_ptr<FullyShardedDataParallel> fsdp, ProcessGroup* dp,
                                   const std::string& dir, std::string description)
    : ShardedModel(std::move(model), std::move(world), std::move(fsdp), dp,
                   std::move(description)) {
  for (const auto& [master, grad] : fsdp_->flat_shards()) {
    nvme_.push_back(std::make_unique<NvmeAdamW>(master.numel(), NvmeAdamWOptions().dir(dir)));
  }
}

NvmeShardedModel::~NvmeShardedModel() = default;

void NvmeShardedModel::optimizer_step(torch::optim::AdamW& optimizer, double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  const auto& options = static_cast<const torch::optim::AdamWOptions&>(optimizer.defaults());
  const double weight_decay = options.weight_decay();
  const auto* fused = dynamic_cast<const FusedAdamW*>(&optimizer);
  const AdamWStep hyper = AdamWStep()
                              .lr(lr)
                              .betas(std::get<0>(options.betas()), std::get<1>(options.betas()))
                              .eps(options.eps())
                              .weight_decay(0.0)
                              .step(steps_)
                              .bias_correction(!fused || fused->bias_correction());
  const auto shards = fsdp_->flat_shards();
  for (size_t u = 0; u < shards.size(); ++u) {
    const int unit = static_cast<int>(u);
    // With the parameter shards in files too, one unit's shard is in memory at a time.
    fsdp_->load_shards(unit);
    fsdp_->prefetch_shards(unit + 1);  // read while this unit steps
    // AdamW's decoupled decay comes first and is elementwise, so applying it per piece and
    // then stepping the whole shard with no decay is the same update.
    if (weight_decay != 0.0) {
      for (const auto& s : fsdp_->segments()) {
        if (s.unit == unit && s.shape.size() >= 2) s.param.mul_(1.0 - lr * weight_decay);
      }
    }
    nvme_[u]->step(shards[u].first, shards[u].second, hyper);
    fsdp_->store_shards(unit);
  }
  fsdp_->after_optimizer_step();
}

CheckpointContents NvmeShardedModel::checkpoint_contents(const torch::optim::AdamW& /*optimizer*/) {
  // The same tensors as ShardedModel writes, each slice fetched as it is written: only the unit
  // being written is in memory (its master shard and its two moments, read from their files),
  // never the whole shard of the model.
  CheckpointContents out;
  const bool has_state = steps_ > 0;  // the same on every rank
  model_specs(out, has_state);
  if (!fsdp_->holds_unique_shards()) return out;
  out.fetchers.resize(out.slices.size());  // the buffers' slices: written as they are
  struct Loaded {
    int unit = -1;
    at::Tensor exp_avg, exp_avg_sq;
  };
  auto loaded = std::make_shared<Loaded>();
  FullyShardedDataParallel* fsdp = fsdp_.get();
  auto& nvme = nvme_;
  auto bring = [loaded, fsdp, &nvme, has_state](int unit) {
    if (loaded->unit == unit) return;
    if (loaded->unit >= 0) fsdp->store_shards(loaded->unit);
    *loaded = Loaded();
    fsdp->load_shards(unit, /*gradients=*/false);
    loaded->unit = unit;
    if (has_state) {
      loaded->exp_avg = nvme[unit]->exp_avg();
      loaded->exp_avg_sq = nvme[unit]->exp_avg_sq();
    }
  };
  // Describes a slice of `numel` fp32 elements without memory.
  auto described = [](int64_t numel) {
    at::Tensor t = at::empty({numel}, at::kFloat);
    detail::release_storage(t);
    return t;
  };
  for (const auto& s : fsdp_->segments()) {
    const int64_t numel = s.param.numel();
    const at::Tensor param = s.param.detach();
    out.slices.push_back({s.name, s.offset, described(numel)});
    out.fetchers.push_back([bring, param, unit = s.unit] {
      bring(unit);
      return param.clone();
    });
    if (!has_state) continue;
    for (const bool second : {false, true}) {
      out.slices.push_back(
          {"optim." + s.name + (second ? ".exp_avg_sq" : ".exp_avg"), s.offset, described(numel)});
      out.fetchers.push_back([bring, loaded, second, unit = s.unit, at = s.shard_offset, numel] {
        bring(unit);
        return (second ? loaded->exp_avg_sq : loaded->exp_avg).narrow(0, at, numel).clone();
      });
    }
    if (s.offset == 0) {
      out.slices.push_back(
          {"optim." + s.name + ".step", 0, at::scalar_tensor(steps_, at::kLong).reshape({1})});
      out.fetchers.emplace_back();
    }
  }
  // The last unit goes back to its file when the save is done (after_save stores all).
  return out;
}

void NvmeShardedModel::restore_shards(const ShardedCheckpointReader& reader,
                                      torch::optim::AdamW& /*optimizer*/) {
  const auto shards = fsdp_->flat_shards();
  for (size_t u = 0; u < shards.size(); ++u) {
    const int unit = static_cast<int>(u);
    fsdp_->load_shards(unit, /*gradients=*/false);
    fsdp_->prefetch_shards(unit + 1);
    // A checkpoint without optimizer state starts the moments from zeros, as a fresh run does.
    at::Tensor avg = at::zeros_like(shards[u].first);
    at::Tensor avg_sq = at::zeros_like(avg);
    for (const auto& s : fsdp_->segments()) {
      if (s.unit != unit) continue;
      reader.read_flat_into(s.name, s.offset, s.param.detach());
      const std::string prefix = "optim." + s.name;
      if (!reader.find(prefix + ".exp_avg")) continue;
      const int64_t numel = s.param.numel();
      reader.read_flat_into(prefix + ".exp_avg", s.offset, avg.narrow(0, s.shard_offset, numel));
      reader.read_flat_into(prefix + ".exp_avg_sq", s.offset,
                            avg_sq.narrow(0, s.shard_offset, numel));
      steps_ = reader.read(prefix + ".step").item<int64_t>();
    }
    nvme_[u]->load(avg, avg_sq);
    fsdp_->store_shards(unit);
  }
}

}  // namespace shardtrain
