// Deferred initialization: a model described without memory, then sharded, holds on each rank
// exactly the slices a model built whole in one process with the same seed has, bit for bit.
#include <gtest/gtest.h>

#include <mutex>

#include "parallel/sharded_training.h"
#include "shardtrain/ddp.h"
#include "shardtrain/zero.h"
#include "support.h"

namespace shardtrain {
namespace deferred_init_test {

using namespace testing;

constexpr uint64_t kSeed = 1234;

std::map<std::string, at::Tensor> whole_model(const ModelConfig& config) {
  Transformer model(config, ModelInit().seed(kSeed));
  std::map<std::string, at::Tensor> params;
  for (const auto& item : model->named_parameters()) {
    params[item.key()] = item.value().detach().reshape({-1}).clone();
  }
  return params;
}

struct Strategy {
  std::string label;
  Shard shard;
};

std::vector<Strategy> strategies() {
  std::vector<Strategy> all;
  all.push_back({"fsdp full_shard", [](Transformer model, const DeviceMesh& mesh) {
                   return flat_shard(model, mesh,
                                     FSDPOptions().sharding(ShardingStrategy::kFullShard));
                 }});
  for (int stage : {1, 2, 3}) {
    all.push_back(
        {"zero " + std::to_string(stage), [stage](Transformer model, const DeviceMesh& mesh) {
           return zero_shard(model, mesh, ZeroOptions().stage(stage));
         }});
  }
  // Units below the persistence threshold stay gathered from the start: their full values are
  // initialized whole on every rank, the others only as shards.
  all.push_back({"zero 3, root persistent", [](Transformer model, const DeviceMesh& mesh) {
                   ZeroBehaviour knobs;
                   knobs.persistence_threshold = 30000;
                   return zero_shard(model, mesh, ZeroOptions().stage(3).behaviour(knobs));
                 }});
  all.push_back({"fsdp full_shard, bf16 parameters", [](Transformer model, const DeviceMesh& mesh) {
                   return flat_shard(
                       model, mesh,
                       FSDPOptions().mixed_precision(MixedPrecision().param_dtype(at::kBFloat16)));
                 }});
  return all;
}

std::vector<std::pair<std::string, ModelConfig>> configs() {
  return {{"tiny", model_preset("tiny")},
          {"tiny-llama", model_preset("tiny-llama")},
          {"tiny-llama3.2", model_preset("tiny-llama3.2")},
          {"tiny-qwen2", model_preset("tiny-qwen2")},
          {"tiny-qwen3", model_preset("tiny-qwen3")},
          {"tiny-mistral", model_preset("tiny-mistral")},
          {"tiny-moe", model_preset("tiny-moe")},
          {"odd sizes", small_config()}};
}

TEST(DeferredInit, DescribedModelHoldsNoParameterMemory) {
  Transformer model(model_preset("tiny"), ModelInit().seed(kSeed).deferred());
  EXPECT_FALSE(model->materialized());
  for (const auto& p : model->parameters()) {
    EXPECT_FALSE(is_materialized(p));
    EXPECT_EQ(p.storage().nbytes(), 0u);
  }
  model->materialize();
  EXPECT_TRUE(model->materialized());
  const auto want = whole_model(model_preset("tiny"));
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(at::equal(item.value().detach().reshape({-1}), want.at(item.key()))) << item.key();
  }
}

TEST(DeferredInit, InitializerFillsAnyRangeAsTheWholeParameter) {
  const Transformer model(model_preset("tiny"), ModelInit().seed(kSeed).deferred());
  const ParameterInitializer init = model->initializer();
  const auto want = whole_model(model_preset("tiny"));
  const at::Tensor& embedding = want.at("tok_emb.weight");
  for (const auto& [begin, length] :
       {std::pair<int64_t, int64_t>{0, 1}, {1, 1}, {1, 2}, {7, 100}, {embedding.numel() - 3, 3}}) {
    at::Tensor out = at::empty({length});
    init("tok_emb.weight", begin, out);
    EXPECT_TRUE(at::equal(out, embedding.narrow(0, begin, length))) << begin << "+" << length;
  }
  at::Tensor out = at::empty({4});
  EXPECT_THROW(init("tok_emb.weight", embedding.numel() - 3, out), std::invalid_argument);
  EXPECT_THROW(init("no.such.weight", 0, out), std::invalid_argument);
  // The seed matters, and draws look like N(0, 0.02).
  const at::Tensor other = Transformer(model_preset("tiny"), ModelInit().seed(kSeed + 1))
                               ->named_parameters()["tok_emb.weight"];
  EXPECT_FALSE(at::equal(other.reshape({-1}), embedding));
  EXPECT_NEAR(embedding.std().item<double>(), 0.02, 0.001);
  EXPECT_NEAR(embedding.mean().item<double>(), 0.0, 0.001);
}

TEST(DeferredInit, EachRankInitializesItsSlicesBitIdentically) {
  for (const auto& [config_name, config] : configs()) {
    const auto want = whole_model(config);
    int64_t total = 0;
    for (const auto& [name, value] : want) total += value.numel();
    for (const auto& strategy : strategies()) {
      for (int world : {1, 2, 3, 4}) {
        SCOPED_TRACE(config_name + ", " + strategy.label + ", " + std::to_string(world) + " ranks");
        std::mutex mutex;
        std::vector<std::string> wrong;
        int64_t covered = 0;
        std::map<std::string, at::Tensor> gathered;
        run_local_ranks(world, [&](ProcessGroup& group) {
          auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
          DeviceMesh mesh(shared, MeshShape());
          Transformer model(config, ModelInit().seed(kSeed).deferred());
          auto fsdp = strategy.shard(model, mesh);
          int64_t mine = 0;
          std::vector<std::string> bad;
          for (const auto& s : fsdp->segments()) {
            const at::Tensor expected = want.at(s.name).narrow(0, s.offset, s.param.numel());
            if (!at::equal(s.param.detach(), expected)) bad.push_back(s.name);
            mine += s.param.numel();
          }
          auto full = fsdp->full_parameters();  // collective: every rank
          std::lock_guard<std::mutex> lock(mutex);
          wrong.insert(wrong.end(), bad.begin(), bad.end());
          covered += mine;
          if (group.rank() == 0) {
            for (auto& [name, value] : full) gathered[name] = value.reshape({-1});
          }
        });
        EXPECT_TRUE(wrong.empty()) << "first differing parameter: " << wrong.front();
        EXPECT_EQ(covered, total);  // the shards partition the model
        ASSERT_EQ(gathered.size(), want.size());
        for (const auto& [name, value] : want)
          EXPECT_TRUE(at::equal(gathered.at(name), value)) << name;
      }
    }
  }
}

TEST(DeferredInit, ShardedForwardMatchesTheWholeModel) {
  // What the units compute with (gathered, or kept gathered from the start) is the whole model.
  const ModelConfig config = small_config();
  Transformer whole(config, ModelInit().seed(kSeed));
  const double want = loss_of(whole, tokens(0)).item<double>();
  for (const auto& strategy : strategies()) {
    if (strategy.label.find("bf16") != std::string::npos) continue;
    SCOPED_TRACE(strategy.label);
    std::mutex mutex;
    std::vector<double> losses;
    run_local_ranks(3, [&](ProcessGroup& group) {
      auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
      DeviceMesh mesh(shared, MeshShape());
      Transformer model(config, ModelInit().seed(kSeed).deferred());
      auto fsdp = strategy.shard(model, mesh);
      const double loss = loss_of(model, tokens(0)).item<double>();
      std::lock_guard<std::mutex> lock(mutex);
      losses.push_back(loss);
    });
    for (double loss : losses) EXPECT_NEAR(loss, want, 1e-6 * want);
  }
}

TEST(DeferredInit, DataParallelReplicasEqualTheWholeModel) {
  const ModelConfig config = model_preset("tiny");
  const auto want = whole_model(config);
  std::mutex mutex;
  std::vector<std::string> wrong;
  run_local_ranks(3, [&](ProcessGroup& group) {
    auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    Transformer model(config, ModelInit().seed(kSeed));
    DistributedDataParallel ddp(model.ptr(), shared);
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& item : model->named_parameters()) {
      if (!at::equal(item.value().detach().reshape({-1}), want.at(item.key()))) {
        wrong.push_back(item.key());
      }
    }
  });
  EXPECT_TRUE(wrong.empty()) << wrong.front();
}

}  // namespace deferred_init_test
}  // namespace shardtrain
