// The planner's memory math against published worked examples.
#include <gtest/gtest.h>

#include <cmath>

#include "shardtrain/plan.h"

namespace shardtrain {
namespace memory_math_test {

constexpr double kGB = 1e9;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

MemoryBreakdown states(int stage, double params, int n, ZeroAccounting accounting,
                       const PrecisionBytes& bytes, double largest = 0, bool offload_opt = false,
                       bool offload_params = false) {
  ZeroMemoryInputs in;
  in.parameters = params;
  in.largest_layer = largest;
  in.n = n;
  in.stage = stage;
  in.offload_optimizer = offload_opt;
  in.offload_params = offload_params;
  return zero_model_states(in, bytes, accounting);
}

TEST(PlanMemoryMath, MixedPrecisionAdamIs16BytesPerParameter) {
  // 2 (bf16 weights) + 2 (bf16 gradients) + 4 (fp32 master) + 4 + 4 (Adam moments).
  const PrecisionBytes b = PrecisionBytes::of("bf16", "adamw");
  EXPECT_EQ(b.param + b.grad + b.optimizer_total(), 16.0);
  const MemoryBreakdown ddp = states(0, 7e9, 1, ZeroAccounting::kZeroPaper, b);
  EXPECT_DOUBLE_EQ(ddp.model_states(), 112.0 * kGB);  // 7B -> 112 GB
}

TEST(PlanMemoryMath, ZeroPaperFigureOne) {
  // Rajbhandari et al. 2020, Figure 1: Psi = 7.5B, N_d = 64, K = 12 -> 120, 31.4, 16.6, 1.9 GB
  // per device for the baseline and the three stages (published to one decimal).
  const PrecisionBytes b = PrecisionBytes::of("bf16", "adamw");
  ASSERT_EQ(b.optimizer_total(), 12.0);
  const double published[] = {120.0, 31.4, 16.6, 1.9};
  for (int stage = 0; stage <= 3; ++stage) {
    const double gb = states(stage, 7.5e9, 64, ZeroAccounting::kZeroPaper, b).model_states() / kGB;
    EXPECT_NEAR(gb, published[stage], 0.05) << "stage " << stage;
  }
}

TEST(PlanMemoryMath, DeepSpeedEstimatorFormulas) {
  // DeepSpeed's estimate_zero2/3_model_states_mem_needs without offload: stage 2 needs
  // 4P + 16P/N per GPU, stage 3 4L + 18P/N (L = largest layer).
  const PrecisionBytes b = PrecisionBytes::of("bf16", "adamw");
  const double P = 6.7e9, L = 0.26e9;
  for (int n : {1, 8, 64}) {
    EXPECT_DOUBLE_EQ(states(2, P, n, ZeroAccounting::kEngine, b).total(), 4 * P + 16 * P / n);
    EXPECT_DOUBLE_EQ(states(3, P, n, ZeroAccounting::kEngine, b, L).total(), 4 * L + 18 * P / n);
  }
  // With the optimizer offloaded: 2P (stage 2); 4L + 2P/N; and with the parameters too, 4L.
  EXPECT_DOUBLE_EQ(states(2, P, 8, ZeroAccounting::kEngine, b, 0, true).total(), 2 * P);
  EXPECT_DOUBLE_EQ(states(3, P, 8, ZeroAccounting::kEngine, b, L, true).total(), 4 * L + 2 * P / 8);
  EXPECT_DOUBLE_EQ(states(3, P, 8, ZeroAccounting::kEngine, b, L, true, true).total(), 4 * L);
}

TEST(PlanMemoryMath, DeepSpeedEstimatorPublishedOutputs) {
  const PrecisionBytes b = PrecisionBytes::of("bf16", "adamw");
  // DeepSpeed docs (memory requirements), ZeRO-2 for a 2851M-parameter model on 8 GPUs:
  // 15.93 GB per GPU, 5.31 GB with offload_optimizer=cpu (DeepSpeed's "GB" are GiB).
  EXPECT_NEAR(states(2, 2851e6, 8, ZeroAccounting::kEngine, b).total() / kGiB, 15.93, 0.01);
  EXPECT_NEAR(states(2, 2851e6, 8, ZeroAccounting::kEngine, b, 0, true).total() / kGiB, 5.31, 0.01);
  // ZeRO-3 for t5-small (60,506,624 parameters, largest layer the 32128 x 512 embedding) on one
  // GPU: 1.08, 0.17 (optimizer offloaded) and 0.06 GB (parameters too).
  const double P = 60506624, L = 32128.0 * 512;
  EXPECT_NEAR(states(3, P, 1, ZeroAccounting::kEngine, b, L).total() / kGiB, 1.08, 0.005);
  EXPECT_NEAR(states(3, P, 1, ZeroAccounting::kEngine, b, L, true).total() / kGiB, 0.17, 0.005);
  EXPECT_NEAR(states(3, P, 1, ZeroAccounting::kEngine, b, L, true, true).total() / kGiB, 0.06,
              0.005);
}

TEST(PlanMemoryMath, MegatronDistributedOptimizerTable) {
  // Megatron-LM's distributed optimizer guide, bytes per parameter on d data-parallel ranks:
  // fp16 weights and gradients 20 and 4 + 16/d; bf16 weights with fp32 gradients (main_grad)
  // 18 and 6 + 12/d; fp32 weights and gradients 16 and 8 + 8/d. Not distributed is stage 0,
  // distributed is stage 1 (the fp32 state of a rank's partition).
  const double P = 1e9;
  const PrecisionBytes half = PrecisionBytes::of("bf16", "adamw");
  const PrecisionBytes main_grad = PrecisionBytes::of("bf16", "adamw", /*fp32_grads=*/true);
  const PrecisionBytes full = PrecisionBytes::of("fp32", "adamw");
  EXPECT_DOUBLE_EQ(main_grad.grad, 4.0);
  for (int d : {1, 8, 64}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    EXPECT_DOUBLE_EQ(states(0, P, d, ZeroAccounting::kEngine, half).total(), 20 * P);
    EXPECT_DOUBLE_EQ(states(1, P, d, ZeroAccounting::kEngine, half).total(), 4 * P + 16 * P / d);
    EXPECT_DOUBLE_EQ(states(0, P, d, ZeroAccounting::kEngine, main_grad).total(), 18 * P);
    EXPECT_DOUBLE_EQ(states(1, P, d, ZeroAccounting::kEngine, main_grad).total(),
                     6 * P + 12 * P / d);
    EXPECT_DOUBLE_EQ(states(0, P, d, ZeroAccounting::kEngine, full).total(), 16 * P);
    EXPECT_DOUBLE_EQ(states(1, P, d, ZeroAccounting::kEngine, full).total(), 8 * P + 8 * P / d);
  }
  EXPECT_THROW(PrecisionBytes::of("fp32", "adamw", true), std::invalid_argument);
}

TEST(PlanMemoryMath, OffloadMovesStatesToTheHost) {
  const PrecisionBytes b = PrecisionBytes::of("bf16", "adamw");
  // Stage 3, both offloaded: per device the host holds fp16 params 2, fp32 grads 4, K = 12.
  const MemoryBreakdown m = states(3, 8e9, 8, ZeroAccounting::kEngine, b, 0, true, true);
  EXPECT_DOUBLE_EQ(m.host, 18 * 8e9 / 8);
  EXPECT_DOUBLE_EQ(m.params + m.grads + m.optimizer, 0.0);
}

TEST(PlanMemoryMath, Fp32ParametersNeedNoMasterCopy) {
  const PrecisionBytes b = PrecisionBytes::of("bf16-autocast", "adamw");
  EXPECT_EQ(b.param, 4.0);
  EXPECT_EQ(b.grad, 4.0);
  EXPECT_EQ(b.optimizer_total(), 8.0);
  EXPECT_EQ(PrecisionBytes::of("fp32", "sgd").optimizer_total(), 4.0);
  // Without master weights the engine and the paper agree: 4/N + 4/N + 8/N at stage 3.
  EXPECT_DOUBLE_EQ(states(3, 1e6, 4, ZeroAccounting::kEngine, b).model_states(), 16e6 / 4);
  EXPECT_THROW(PrecisionBytes::of("int8", "adamw"), std::invalid_argument);
  EXPECT_THROW(PrecisionBytes::of("bf16", "lion"), std::invalid_argument);
}

TEST(PlanMemoryMath, KorthikantiActivationFormulas) {
  // Korthikanti et al. 2022, per layer: sbh(34 + 5as/h); with tensor parallelism t alone
  // sbh(10 + 24/t + 5as/(ht)); with sequence parallelism sbh/t (34 + 5as/h); full recomputation
  // 2sbh.
  PlanModel m;
  m.d_model = 2048, m.n_heads = 16, m.n_kv_heads = 16, m.ffn_hidden = 4 * 2048;
  m.dropout = 0.1;  // the paper's layers have dropout
  const double s = 1024, b = 2, h = 2048, a = 16;
  const double sbh = s * b * h;
  EXPECT_DOUBLE_EQ(block_activation_bytes(m, 1024, 2, false, false), sbh * (34 + 5 * a * s / h));
  for (int t : {2, 4, 8}) {
    EXPECT_DOUBLE_EQ(block_activation_bytes(m, 1024, 2, false, false, t, false),
                     sbh * (10 + 24.0 / t + 5 * a * s / (h * t)));
    EXPECT_DOUBLE_EQ(block_activation_bytes(m, 1024, 2, false, false, t, true),
                     sbh / t * (34 + 5 * a * s / h));
  }
  EXPECT_DOUBLE_EQ(block_activation_bytes(m, 1024, 2, true, false), 2 * sbh);
}

TEST(PlanMemoryMath, ModelInventoryFromPresets) {
  // Llama 3 8B has 8,030,261,248 parameters (Meta's model card rounds it to 8.03B).
  const PlanModel m = PlanModel::from_config(model_preset("llama3-8b"));
  EXPECT_EQ(m.num_parameters, 8030261248);
  // One block: q, o (4096^2 each), k, v (1024 x 4096 each), three 14336 x 4096 MLP matrices,
  // two norms.
  EXPECT_EQ(m.block_parameters,
            2 * 4096LL * 4096 + 2 * 1024LL * 4096 + 3 * 14336LL * 4096 + 2 * 4096);
  EXPECT_EQ(m.root_parameters, 2 * 128256LL * 4096 + 4096);  // embedding, head, final norm
  EXPECT_EQ(m.largest_layer, 128256LL * 4096);
  EXPECT_TRUE(m.gated_mlp);
  EXPECT_EQ(m.preset, "llama3-8b");
}

TEST(PlanMemoryMath, BareShapesAreCheckedAgainstTheCount) {
  const PlanModel m = PlanModel::from_shapes(7e9, 32, 4096, 32, 0, 11008, 32000, true);
  EXPECT_EQ(m.block_parameters, 4 * 4096LL * 4096 + 3 * 4096LL * 11008 + 2 * 4096);
  EXPECT_EQ(m.root_parameters, 7000000000LL - 32 * m.block_parameters);
  EXPECT_EQ(m.n_kv_heads, 32);
  try {
    PlanModel::from_shapes(1e9, 32, 4096, 32, 0, 11008, 32000, true);
    FAIL() << "expected an error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("more than the 1000000000 given"), std::string::npos);
  }
}

}  // namespace memory_math_test
}  // namespace shardtrain
