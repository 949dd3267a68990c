// precision.fp8 in the trainer: the run follows the fp32 one closely without equalling it; DDP,
// FSDP and ZeRO-3 over 2 ranks train alike (every rank's scales from the amax of all of them),
// and so does activation checkpointing; a resumed run continues with the saved scales and amax
// history; the layouts and settings it does not run with are refused.
#include <gtest/gtest.h>

#include <cmath>

#include "plan/run_estimate.h"
#include "shardtrain/plan.h"
#include "shardtrain/train.h"
#include "train/memory_check.h"
#include "train/run_manifest.h"
#include "train/trainer_run_test.h"

namespace shardtrain {
namespace fp8_trainer_test {

const std::vector<std::string> kFp8 = {"precision.fp8=\"hybrid\"", "precision.fp8_amax_history=4"};

class Fp8TrainerTest : public testing::TrainerRunTest {
 protected:
  Fp8TrainerTest() : TrainerRunTest(5) {}
};

TEST_F(Fp8TrainerTest, FollowsTheHigherPrecisionRunWithoutEqualingIt) {
  const auto plain = testing::train_on_ranks(1, config("plain", {}), 5);
  const auto fp8 = testing::train_on_ranks(1, config("fp8", kFp8), 5);
  const auto e4m3 = testing::train_on_ranks(1, config("e4m3", {"precision.fp8=\"e4m3\""}), 5);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_NEAR(fp8[i], plain[i], 0.05 * plain[i]) << i;
    EXPECT_NEAR(e4m3[i], plain[i], 0.05 * plain[i]) << i;
  }
  EXPECT_GT(std::abs(fp8.back() - plain.back()), 1e-6);
  EXPECT_GT(std::abs(fp8.back() - e4m3.back()), 1e-6);  // E5M2 gradients differ from E4M3's
  EXPECT_LT(fp8.back(), fp8.front());
  // Under bf16 autocast too.
  std::vector<std::string> bf16 = kFp8;
  bf16.push_back("precision.autocast=\"bf16\"");
  const auto autocast = testing::train_on_ranks(1, config("bf16", bf16), 5);
  EXPECT_NEAR(autocast.back(), fp8.back(), 0.05 * fp8.back());
}

TEST_F(Fp8TrainerTest, DataParallelFsdpAndZeroTrainAlike) {
  // The weights' last bits differ between an all-reduce and a reduce-scatter, and a weight near
  // the middle of two fp8 values can round to the other one: DDP agrees with the sharded layouts
  // to 1e-4, and those two with each other exactly.
  const auto ddp = testing::train_on_ranks(2, config("ddp", kFp8, "ddp"), 4);
  const auto fsdp = testing::train_on_ranks(2, config("fsdp", kFp8, "fsdp"), 4);
  testing::expect_same_losses(fsdp, ddp, 1e-4);
  std::vector<std::string> zero3 = kFp8;
  zero3.push_back("parallel.zero.stage=3");
  testing::expect_same_losses(testing::train_on_ranks(2, config("zero", zero3, "zero"), 4), fsdp,
                              1e-9);
  std::vector<std::string> checkpointed = kFp8;
  checkpointed.push_back("train.activation_checkpointing=true");
  testing::expect_same_losses(testing::train_on_ranks(2, config("ac", checkpointed, "ddp"), 4), ddp,
                              1e-6);
}

TEST_F(Fp8TrainerTest, AResumedRunContinuesWithTheSavedScales) {
  const std::string saved = expect_exact_resume(kFp8, 2, 5);
  // Another history length cannot take the saved history.
  std::vector<std::string> other = kFp8;
  other.push_back("run.resume=\"" + saved + "\"");
  other.push_back("precision.fp8_amax_history=8");
  testing::expect_refused(
      1, [&] { return config("other", other); }, "precision.fp8_amax_history must be the saving");
}

// The memory check counts the emulation's fp32 copies: a budget that the same run without fp8
// just fits refuses it, naming them.
TEST_F(Fp8TrainerTest, TheMemoryCheckCountsTheEmulationsCopies) {
  const TrainConfig plain = config("plain", {});
  const double needed =
      detail::estimate_run(detail::run_manifest(plain, 1), hardware_spec("cpu"), "plain")
          .run.memory.total();
  const detail::MemoryBudget budget{static_cast<int64_t>(needed) + 1, "a test budget"};
  EXPECT_NO_THROW(detail::check_memory_fits(plain, 1, budget, 0));
  try {
    detail::check_memory_fits(config("fp8", kFp8), 1, budget, 0);
    ADD_FAILURE() << "fp8 passed the memory check";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("precision.fp8's fp32 copies"), std::string::npos)
        << e.what();
  }
}

TEST_F(Fp8TrainerTest, LayoutsAndSettingsItDoesNotRunWithAreRefused) {
  std::vector<std::string> tp = kFp8;
  tp.push_back("parallel.tp=2");
  tp.push_back("train.micro_batch=2");
  testing::expect_refused(
      2, [&] { return config("tp", tp); }, "(parallel.tp, pp, cp and ep must be 1)");
  std::vector<std::string> lora = kFp8;
  lora.push_back("lora.rank=4");
  testing::expect_refused(
      1, [&] { return config("lora", lora); }, "precision.fp8 with LoRA adapters");
  std::vector<std::string> fp16 = kFp8;
  fp16.push_back("precision.autocast=\"fp16\"");
  testing::expect_refused(
      1, [&] { return config("fp16", fp16); }, "precision.fp8 with precision.autocast = \"fp16\"");
  std::vector<std::string> replicas = kFp8;
  replicas.push_back("run.fault_tolerance=\"replicas\"");
  testing::expect_refused(
      1, [&] { return config("replicas", replicas, "ddp"); },
      "precision.fp8 with run.fault_tolerance = \"replicas\"");
  testing::expect_refused(
      1, [&] { return config("kind", {"precision.fp8=\"e5m2\""}); },
      "precision.fp8 must be \"none\", \"e4m3\" or \"hybrid\", got \"e5m2\"");
  testing::expect_refused(
      1, [&] { return config("algo", {"precision.fp8_amax_algo=\"mean\""}); },
      "precision.fp8_amax_algo must be \"max\" or \"most_recent\"");
}

}  // namespace fp8_trainer_test
}  // namespace shardtrain
