// Tensor parallelism against one process: the vocabulary-parallel loss, the deferred
// initialization of slices, and training of both families at tp = 2 and 4 with and without
// sequence parallelism and activation checkpointing.
#include "shardtrain/tensor_parallel.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "parallel/tensor/tp_state.h"
#include "sharded_training.h"
#include "shardtrain/memory.h"

namespace shardtrain::testing {
namespace tensor_parallel_test {

std::shared_ptr<ProcessGroup> borrowed(ProcessGroup& group) {
  return std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
}

// Heads, key/value heads, FFN width and vocabulary all divide by 4.
ModelConfig tp_config(ModelFamily family, int64_t kv_heads = 4) {
  ModelConfig config = small_config(family);
  config.vocab_size = 68;
  config.d_model = 32;
  config.n_heads = 4;
  config.n_kv_heads = family == ModelFamily::kGpt2 ? 4 : kv_heads;
  config.ffn_hidden = 48;
  return config;
}

TEST(VocabParallelCrossEntropy, EqualsTheLossOfTheWholeLogitsAndItsGradient) {
  torch::manual_seed(3);
  const int64_t n = 10, vocab = 12;
  const at::Tensor logits = at::randn({n, vocab}, at::kDouble) * 3;
  const at::Tensor targets = at::randint(vocab, {n}, at::kLong);
  at::Tensor whole = logits.clone().requires_grad_();
  const at::Tensor want = at::cross_entropy_loss(whole, targets);
  want.backward();
  for (int tp : {2, 3}) {
    run_local_ranks(tp, [&](ProcessGroup& group) {
      const int64_t local = vocab / tp;
      at::Tensor mine = logits.narrow(1, group.rank() * local, local).clone().requires_grad_();
      const at::Tensor got = vocab_parallel_cross_entropy(mine, targets, group);
      EXPECT_NEAR(got.item<double>(), want.item<double>(), 1e-12);
      got.backward();
      EXPECT_TRUE(
          at::allclose(mine.grad(), whole.grad().narrow(1, group.rank() * local, local), 0, 1e-12));
    });
  }
}

TEST(VocabParallelCrossEntropy, NeverHoldsTheWholeLogits) {
  install_cpu_memory_tracking();
  const int64_t n = 512, vocab = 4096, tp = 2;
  const int64_t whole_bytes = n * vocab * 4;
  std::vector<at::Tensor> inputs(tp);
  const at::Tensor targets = at::randint(vocab, {n}, at::kLong);
  for (int r = 0; r < tp; ++r) inputs[r] = at::randn({n, vocab / tp}).requires_grad_();
  std::atomic<int64_t> peak{0};
  std::mutex mutex;
  int64_t base = 0;
  run_local_ranks(tp, [&](ProcessGroup& group) {
    group.barrier()->wait();
    if (group.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      reset_peak_cpu_memory();
      base = cpu_memory_stats().live_bytes;
    }
    group.barrier()->wait();
    vocab_parallel_cross_entropy(inputs[group.rank()], targets, group).backward();
    group.barrier()->wait();
    if (group.rank() == 0) peak = cpu_memory_stats().peak_bytes - base;
  });
  // Both ranks together hold about one [N, V] worth (each its slice of the softmax, which
  // becomes the gradient in place). Any rank holding the whole logits, or a second copy of
  // its slice, would take the total past 1.5 of it.
  EXPECT_LT(peak.load(), whole_bytes * 3 / 2) << "whole logits: " << whole_bytes << " bytes";
  EXPECT_GT(peak.load(), whole_bytes / 2);  // the counters saw the computation at all
}

TEST(TensorParallel, DeferredSlicesHoldTheWholeInitialization) {
  for (ModelFamily family : {ModelFamily::kGpt2, ModelFamily::kLlama}) {
    const ModelConfig config = tp_config(family);
    const Transformer whole(config, ModelInit().seed(11));
    run_local_ranks(2, [&](ProcessGroup& group) {
      Transformer model(config, ModelInit().seed(11).deferred());
      parallelize_module(model, borrowed(group), transformer_tp_plan(config, 2));
      EXPECT_FALSE(model->materialized());
      model->materialize();
      // A split parameter holds half the elements.
      EXPECT_EQ(model
                    ->named_parameters()["blocks.0.mlp." +
                                         std::string(family == ModelFamily::kGpt2 ? "fc" : "up") +
                                         ".weight"]
                    .size(0),
                config.ffn_hidden / 2);
      for (const auto& [name, value] : whole_parameters(model)) {
        EXPECT_TRUE(at::equal(value, whole->named_parameters()[name])) << name;
      }
    });
  }
}

TrainingRun tensor_parallel_run(int tp, const ModelConfig& config, bool sequence_parallel,
                                bool checkpointing, int steps) {
  TrainingRun result;
  std::mutex mutex;
  run_local_ranks(tp, [&](ProcessGroup& group) {
    Transformer model = make_model(config);
    model->set_activation_checkpointing(checkpointing);
    parallelize_module(model, borrowed(group), transformer_tp_plan(config, tp),
                       TensorParallelOptions().sequence_parallel(sequence_parallel));
    std::vector<at::Tensor> decay, no_decay;
    for (const auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
    auto adamw = make_adamw(decay, no_decay);
    TrainingRun run;
    for (int s = 0; s < steps; ++s) {
      adamw.zero_grad();
      const at::Tensor batch = tokens(s);
      const at::Tensor logits = model->forward(batch.narrow(1, 0, kSeq));
      EXPECT_EQ(logits.size(-1), config.vocab_size / tp);
      at::Tensor loss = vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}),
                                                     batch.narrow(1, 1, kSeq).reshape({-1}), group);
      loss.backward();
      clip_grad_norm(model, 0.5);
      adamw.step();
      run.losses.push_back(loss.item<double>());
    }
    for (const auto& [name, value] : whole_parameters(model)) run.params[name] = value;
    std::lock_guard<std::mutex> lock(mutex);
    if (group.rank() == 0) result = std::move(run);
  });
  return result;
}

struct Case {
  ModelFamily family;
  int tp;
  bool sequence_parallel;
  bool checkpointing;
};

class TensorParallelTraining : public ::testing::TestWithParam<Case> {};

TEST_P(TensorParallelTraining, MatchesOneProcessAfterTenSteps) {
  const Case c = GetParam();
  // Grouped-query attention (2 key/value heads for 4 query heads) wherever tp allows it.
  const ModelConfig config = tp_config(c.family, c.tp == 4 ? 4 : 2);
  const TrainingRun want = reference(10, config);
  const TrainingRun got =
      tensor_parallel_run(c.tp, config, c.sequence_parallel, c.checkpointing, 10);
  expect_equivalent(got, want, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Families, TensorParallelTraining,
                         ::testing::Values(Case{ModelFamily::kGpt2, 2, false, false},
                                           Case{ModelFamily::kGpt2, 2, true, true},
                                           Case{ModelFamily::kGpt2, 4, true, false},
                                           Case{ModelFamily::kLlama, 2, false, true},
                                           Case{ModelFamily::kLlama, 2, true, false},
                                           Case{ModelFamily::kLlama, 4, true, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const Case& c = info.param;
                           return std::string(c.family == ModelFamily::kGpt2 ? "Gpt2" : "Llama") +
                                  "Tp" + std::to_string(c.tp) + (c.sequence_parallel ? "Sp" : "") +
                                  (c.checkpointing ? "Checkpointed" : "");
                         });

// A module of one's own: its torch::nn::Linear layers split by the plan, the collectives in
// the forward it writes (Megatron's MLP: f, column-parallel, GELU, row-parallel, g, then the
// bias).
struct OwnMlpImpl : torch::nn::Module {
  OwnMlpImpl() {
    torch::manual_seed(5);
    up = register_module("up", torch::nn::Linear(12, 16));
    down = register_module("down", torch::nn::Linear(torch::nn::LinearOptions(16, 12).bias(false)));
    bias = register_parameter("bias", torch::randn({12}));
  }
  at::Tensor forward(const at::Tensor& x, ProcessGroup* group) {
    const at::Tensor in = group ? copy_to_tensor_parallel(x, *group) : x;
    const at::Tensor partial = down->forward(at::gelu(up->forward(in)));
    return (group ? reduce_from_tensor_parallel(partial, *group) : partial) + bias;
  }
  torch::nn::Linear up{nullptr}, down{nullptr};
  at::Tensor bias;
};
TORCH_MODULE(OwnMlp);

TEST(TensorParallel, SplitsTheLinearLayersOfAModuleOfOnesOwn) {
  static std::mutex build;
  const at::Tensor x = at::randn({3, 5, 12});
  OwnMlp whole;
  whole->forward(x, nullptr).pow(2).sum().backward();
  run_local_ranks(2, [&](ProcessGroup& group) {
    OwnMlp mine = [] {
      std::lock_guard<std::mutex> lock(build);
      return OwnMlp();
    }();
    parallelize_module(*mine, borrowed(group),
                       {{"up", ColwiseParallel()}, {"down", RowwiseParallel()}});
    EXPECT_EQ(mine->up->weight.size(0), 8);
    EXPECT_EQ(mine->down->weight.size(1), 8);
    const at::Tensor y = mine->forward(x, &group);
    EXPECT_TRUE(at::allclose(y, whole->forward(x, nullptr), 1e-5, 1e-6));
    y.pow(2).sum().backward();
    const int64_t r = group.rank();
    EXPECT_TRUE(at::allclose(mine->up->weight.grad(), whole->up->weight.grad().narrow(0, 8 * r, 8),
                             1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(mine->down->weight.grad(),
                             whole->down->weight.grad().narrow(1, 8 * r, 8), 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(mine->bias.grad(), whole->bias.grad(), 1e-5, 1e-6));
    // A row-parallel layer with a bias, or something that is no linear layer, is refused.
    OwnMlp other = [] {
      std::lock_guard<std::mutex> lock(build);
      return OwnMlp();
    }();
    EXPECT_THROW(parallelize_module(*other, borrowed(group), {{"up", RowwiseParallel()}}),
                 std::invalid_argument);
    EXPECT_THROW(parallelize_module(*other, borrowed(group), {{"", ColwiseParallel()}}),
                 std::invalid_argument);
  });
}

TEST(TensorParallel, RefusesWhatDoesNotDivide) {
  ModelConfig config = tp_config(ModelFamily::kLlama, 2);
  try {
    transformer_tp_plan(config, 4);
    FAIL() << "kv heads 2 at tp=4";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_kv_heads (2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tp=4"), std::string::npos) << e.what();
  }
  config = tp_config(ModelFamily::kGpt2);
  config.ffn_hidden = 50;
  EXPECT_THROW(transformer_tp_plan(config, 4), std::invalid_argument);
  config = tp_config(ModelFamily::kGpt2);
  config.vocab_size = 67;
  try {
    transformer_tp_plan(config, 2);
    FAIL() << "vocabulary 67 at tp=2";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("vocabulary size"), std::string::npos) << e.what();
  }
  // A plan that names no submodule, or leaves the vocabulary whole.
  run_local_ranks(2, [&](ProcessGroup& group) {
    const ModelConfig ok = tp_config(ModelFamily::kGpt2);
    Transformer model(ok, ModelInit().seed(1).deferred());
    EXPECT_THROW(
        parallelize_module(model, borrowed(group), {{"blocks.*.attn.nope", ColwiseParallel()}}),
        std::invalid_argument);
    EXPECT_THROW(
        parallelize_module(model, borrowed(group), {{"blocks.*.attn.qkv", ColwiseParallel(3)}}),
        std::invalid_argument);

    // The same layer twice, or sequence parallelism with the norms left out: refused before
    // anything is cut.
    TpPlan twice = transformer_tp_plan(ok, 2);
    twice.emplace_back("blocks.0.mlp.fc", ColwiseParallel());
    EXPECT_THROW(parallelize_module(model, borrowed(group), twice), std::invalid_argument);
    TpPlan no_norms;
    for (const auto& entry : transformer_tp_plan(ok, 2)) {
      if (entry.second.kind != ParallelStyle::Kind::kSequenceParallel) no_norms.push_back(entry);
    }
    try {
      parallelize_module(model, borrowed(group), no_norms,
                         TensorParallelOptions().sequence_parallel(true));
      ADD_FAILURE() << "sequence parallelism without the norms";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("blocks.0.ln1"), std::string::npos) << e.what();
    }
    EXPECT_EQ(model->layer_split(), nullptr);
    EXPECT_EQ(model->named_parameters()["blocks.0.mlp.fc.weight"].size(0), ok.ffn_hidden);
    // The same plan without sequence parallelism is fine.
    parallelize_module(model, borrowed(group), no_norms);
    EXPECT_EQ(model->named_parameters()["blocks.0.mlp.fc.weight"].size(0), ok.ffn_hidden / 2);
  });
}

}  // namespace tensor_parallel_test
}  // namespace shardtrain::testing
