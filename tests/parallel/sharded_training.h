// Shared by the FSDP and ZeRO tests: a small model, single-process reference training, and the
// same training on in-process ranks under a sharding wrapper.
#pragma once

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <functional>
#include <map>
#include <mutex>

#include "parallel/parallel_model.h"
#include "shardtrain/fsdp.h"
#include "shardtrain/optim.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain::testing {

inline constexpr int64_t kGlobalBatch = 8;
inline constexpr int64_t kSeq = 12;

// Odd sizes, so that no flat parameter divides evenly by 4 ranks.
inline ModelConfig small_config(ModelFamily family = ModelFamily::kGpt2) {
  ModelConfig config = model_preset(family == ModelFamily::kGpt2 ? "tiny" : "tiny-llama");
  config.vocab_size = 67;
  config.context_length = 16;
  config.d_model = 24;
  config.n_layers = 3;
  config.n_heads = 2;
  config.n_kv_heads = family == ModelFamily::kGpt2 ? 2 : 1;
  config.ffn_hidden = 38;
  return config;
}

// Ranks are threads sharing LibTorch's generator: seed and build one at a time.
inline Transformer make_model(const ModelConfig& config) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(7);
  return Transformer(config);
}

inline int64_t parameter_count_of_block() {
  int64_t total = 0;
  for (const auto& p : make_model(small_config())->blocks()[0]->parameters()) total += p.numel();
  return total;
}

inline at::Tensor tokens(int step) {
  return (at::arange(kGlobalBatch * (kSeq + 1), at::kLong) * (7 + step) % 67)
      .view({kGlobalBatch, kSeq + 1});
}

// chunk > 0: the chunked loss of that many tokens per chunk (forward_loss), else the logits'.
inline at::Tensor loss_of(Transformer& model, const at::Tensor& batch, int64_t chunk = 0) {
  if (chunk > 0) {
    return model->forward_loss(batch.narrow(1, 0, kSeq), SequenceLayout(),
                               LossTargets{batch.narrow(1, 1, kSeq), 0.0, chunk});
  }
  const at::Tensor logits = model->forward(batch.narrow(1, 0, kSeq));
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                batch.narrow(1, 1, kSeq).reshape({-1}));
}

inline torch::optim::AdamW make_adamw(const std::vector<at::Tensor>& decay,
                                      const std::vector<at::Tensor>& no_decay) {
  // The key bias's gradient is zero in exact arithmetic (softmax cancels it) and rounding noise
  // in floating point; with eps = 1e-8 Adam turns that noise into steps of size lr whose sign
  // depends on summation order. A larger eps keeps those elements comparable.
  auto options = torch::optim::AdamWOptions(3e-3).weight_decay(0.1).eps(1e-6);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(options));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(options).weight_decay(0.0)));
  return torch::optim::AdamW(std::move(groups), options);
}

struct TrainingRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
  FSDPMemory memory;
  int64_t optimizer_bytes = 0;
};

inline TrainingRun reference(int steps, const ModelConfig& config = small_config(),
                             int64_t chunk = 0) {
  Transformer model = make_model(config);
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto adamw = make_adamw(decay, no_decay);
  TrainingRun run;
  for (int s = 0; s < steps; ++s) {
    adamw.zero_grad();
    at::Tensor loss = loss_of(model, tokens(s), chunk);
    loss.backward();
    clip_grad_norm(model->parameters(), 0.5);
    adamw.step();
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) run.params[item.key()] = item.value().clone();
  return run;
}

using Shard =
    std::function<std::unique_ptr<FullyShardedDataParallel>(Transformer, const DeviceMesh&)>;

// `world` in-process ranks, mesh dp_replicate x dp_shard, each rank on its slice of the batch.
inline TrainingRun sharded_by(int world, int replicate, const Shard& shard, int steps,
                              int micro = 1, bool checkpointing = false,
                              const ModelConfig& config = small_config(), int64_t chunk = 0) {
  TrainingRun result;
  std::mutex mutex;
  run_local_ranks(world, [&](ProcessGroup& group) {
    auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DeviceMesh mesh(shared, MeshShape().dp_replicate(replicate).dp_shard(-1));
    Transformer model = make_model(config);
    model->set_activation_checkpointing(checkpointing);
    auto owned = shard(model, mesh);
    FullyShardedDataParallel& fsdp = *owned;
    std::vector<at::Tensor> decay, no_decay;
    for (const auto& s : fsdp.segments())
      (s.shape.size() >= 2 ? decay : no_decay).push_back(s.param);
    auto adamw = make_adamw(decay, no_decay);
    const int64_t per_rank = kGlobalBatch / world;
    const int64_t per_micro = per_rank / micro;
    TrainingRun run;
    for (int s = 0; s < steps; ++s) {
      fsdp.zero_grad();
      double loss_sum = 0;
      for (int m = 0; m < micro; ++m) {
        at::Tensor loss = loss_of(
            model, tokens(s).narrow(0, group.rank() * per_rank + m * per_micro, per_micro), chunk);
        (loss / static_cast<double>(micro)).backward();
        loss_sum += loss.item<double>() / micro;
      }
      fsdp.clip_grad_norm(0.5);
      fsdp.load_shards();  // parameter shards kept in files (a no-op otherwise)
      adamw.step();
      fsdp.after_optimizer_step();
      at::Tensor mean = at::tensor(loss_sum, at::kDouble);
      group.all_reduce(mean, ReduceOp::kAvg)->wait();
      run.losses.push_back(mean.item<double>());
    }
    for (auto& [name, value] : fsdp.full_parameters()) run.params[name] = value;
    run.memory = fsdp.memory();
    for (const auto& s : fsdp.segments()) {
      const auto& state = static_cast<const torch::optim::AdamWParamState&>(
          *adamw.state().at(detail::optimizer_state_key(s.param)));
      run.optimizer_bytes +=
          static_cast<int64_t>(state.exp_avg().nbytes() + state.exp_avg_sq().nbytes());
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (group.rank() == 0) result = std::move(run);
  });
  return result;
}

inline double relative(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-12);
}

inline void expect_equivalent(const TrainingRun& got, const TrainingRun& want, double tolerance) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_LE(relative(got.losses[s], want.losses[s]), tolerance) << "step " << s;
  }
  ASSERT_EQ(got.params.size(), want.params.size());
  for (const auto& [name, value] : want.params) {
    const at::Tensor& mine = got.params.at(name);
    // Relative in the L2 norm over the tensor (see make_adamw for why not per element).
    const double diff = (mine - value).norm().item<double>();
    const double scale = value.norm().item<double>();
    EXPECT_LE(diff / scale, tolerance) << name;
  }
}

}  // namespace shardtrain::testing
