#include "shardtrain/fsdp.h"

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <mutex>
#include <sstream>

#include "shardtrain/optim.h"
#include "shardtrain/rendezvous.h"

namespace shardtrain {
namespace {

constexpr int64_t kGlobalBatch = 8;
constexpr int64_t kSeq = 12;

// Odd sizes, so that no flat parameter divides evenly by 4 ranks.
ModelConfig small_config(ModelFamily family = ModelFamily::kGpt2) {
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
Transformer make_model(const ModelConfig& config) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(7);
  return Transformer(config);
}

at::Tensor tokens(int step) {
  return (at::arange(kGlobalBatch * (kSeq + 1), at::kLong) * (7 + step) % 67)
      .view({kGlobalBatch, kSeq + 1});
}

at::Tensor loss_of(Transformer& model, const at::Tensor& batch) {
  const at::Tensor logits = model->forward(batch.narrow(1, 0, kSeq));
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                batch.narrow(1, 1, kSeq).reshape({-1}));
}

torch::optim::AdamW make_adamw(const std::vector<at::Tensor>& decay,
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

std::string state_key(const at::Tensor& p) {
  std::ostringstream key;
  key << p.unsafeGetTensorImpl();
  return key.str();
}

struct TrainingRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
  FSDPMemory memory;
  int64_t optimizer_bytes = 0;
};

TrainingRun reference(int steps, const ModelConfig& config = small_config()) {
  Transformer model = make_model(config);
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto adamw = make_adamw(decay, no_decay);
  TrainingRun run;
  for (int s = 0; s < steps; ++s) {
    adamw.zero_grad();
    at::Tensor loss = loss_of(model, tokens(s));
    loss.backward();
    clip_grad_norm(model->parameters(), 0.5);
    adamw.step();
    run.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) run.params[item.key()] = item.value().clone();
  return run;
}

// `world` in-process ranks, mesh dp_replicate x dp_shard, each rank on its slice of the batch.
TrainingRun sharded(int world, int replicate, FSDPOptions options, int steps, int micro = 1,
            bool checkpointing = false, const ModelConfig& config = small_config()) {
  TrainingRun result;
  std::mutex mutex;
  run_local_ranks(world, [&](ProcessGroup& group) {
    auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DeviceMesh mesh(shared, MeshShape().dp_replicate(replicate).dp_shard(-1));
    Transformer model = make_model(config);
    model->set_activation_checkpointing(checkpointing);
    FullyShardedDataParallel fsdp(model, mesh, options);
    std::vector<at::Tensor> decay, no_decay;
    for (const auto& s : fsdp.segments()) (s.shape.size() >= 2 ? decay : no_decay).push_back(s.param);
    auto adamw = make_adamw(decay, no_decay);
    const int64_t per_rank = kGlobalBatch / world;
    const int64_t per_micro = per_rank / micro;
    TrainingRun run;
    for (int s = 0; s < steps; ++s) {
      fsdp.zero_grad();
      double loss_sum = 0;
      for (int m = 0; m < micro; ++m) {
        at::Tensor loss =
            loss_of(model, tokens(s).narrow(0, group.rank() * per_rank + m * per_micro, per_micro));
        (loss / static_cast<double>(micro)).backward();
        loss_sum += loss.item<double>() / micro;
      }
      fsdp.clip_grad_norm(0.5);
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
          *adamw.state().at(state_key(s.param)));
      run.optimizer_bytes += static_cast<int64_t>(state.exp_avg().nbytes() + state.exp_avg_sq().nbytes());
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (group.rank() == 0) result = std::move(run);
  });
  return result;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-12); }

void expect_equivalent(const TrainingRun& got, const TrainingRun& want, double tolerance) {
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

TEST(FSDP, EveryShardingStrategyMatchesSingleProcessTraining) {
  const TrainingRun want = reference(10);
  for (auto [strategy, replicate] :
       std::vector<std::pair<ShardingStrategy, int>>{{ShardingStrategy::kFullShard, 1},
                                                     {ShardingStrategy::kShardGradOp, 1},
                                                     {ShardingStrategy::kNoShard, 1},
                                                     {ShardingStrategy::kHybridShard, 2}}) {
    SCOPED_TRACE(to_string(strategy));
    expect_equivalent(sharded(4, replicate, FSDPOptions().sharding(strategy), 10), want, 1e-5);
  }
}

}  // namespace
}  // namespace shardtrain
