// [compression] in the trainer: a quantizing run differs from a plain one from its offset on
// (and not before), trains under DDP and FSDP as one process does, and the settings that cannot
// hold (split weights, adapters, bad groups) are refused.
#include <gtest/gtest.h>

#include <filesystem>

#include "shardtrain/train.h"
#include "support.h"
#include "train/local_training.h"
#include "train/run_config.h"

namespace shardtrain {
namespace compression_trainer_test {

namespace fs = std::filesystem;

// Weights of the MLPs in 3 bits from the third step, the attention's inputs in 8 from the first.
const std::vector<std::string> kQuantized = {
    "compression.weight_bits=[3]",
    "compression.weight_modules=[[\"mlp.c_fc\", \"mlp.c_proj\"]]",
    "compression.weight_groups=16",
    "compression.weight_offset=2",
    "compression.activation_bits=[8]",
    "compression.activation_modules=[[\"attn.c_attn\"]]",
    "compression.activation_type=\"asymmetric\""};

class CompressionTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_compression");
    testing::write_trainer_corpus(dir_ / "corpus.txt");
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::string& run, const std::vector<std::string>& more,
                     const std::string& strategy = "none") const {
    return testing::two_micro_batch_config(dir_ / "corpus.txt", dir_ / run, 4, strategy, more);
  }

  fs::path dir_;
};

TEST_F(CompressionTrainerTest, QuantizesFromItsOffsetAndTrainsUnderDataParallelism) {
  const auto plain = testing::train_on_ranks(1, config("plain", {}), 4);
  // Inputs only for the first two steps: not the plain run's.
  const auto one = testing::train_on_ranks(1, config("one", kQuantized), 4);
  EXPECT_GT(std::abs(one[0] - plain[0]), 1e-5);
  // Weights alone from the third step: the first two steps are the plain run's.
  const auto late = testing::train_on_ranks(
      1, config("late", {kQuantized[0], kQuantized[1], kQuantized[2], kQuantized[3]}), 4);
  testing::expect_same_losses({late[0], late[1]}, {plain[0], plain[1]}, 1e-6);
  EXPECT_GT(std::abs(late[2] - plain[2]), 1e-5);
  testing::expect_same_losses(testing::train_on_ranks(2, config("ddp", kQuantized, "ddp"), 4), one,
                              1e-5);
  testing::expect_same_losses(testing::train_on_ranks(2, config("fsdp", kQuantized, "fsdp"), 4),
                              one, 1e-5);
  std::vector<std::string> zero3 = kQuantized;
  zero3.push_back("parallel.zero.stage=3");
  testing::expect_same_losses(testing::train_on_ranks(2, config("zero3", zero3, "zero"), 4), one,
                              1e-5);
}

TEST_F(CompressionTrainerTest, SettingsThatCannotHoldAreRefused) {
  auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> all = kQuantized;
    all.insert(all.end(), more.begin(), more.end());
    return all;
  };
  testing::expect_refused(
      1, [&] { return config("lora", with({"lora.rank=4"})); }, "compression with lora.rank > 0");
  testing::expect_refused(
      2,
      [&] {
        return config("tp", with({"parallel.tp=2", "train.micro_batch=2"}), "none");
      },
      "compression with parallel.tp > 1");
  testing::expect_refused(
      1, [&] { return config("bits", with({"compression.weight_bits=[3, 4]"})); },
      "compression.weight_bits has 2 entries and compression.weight_modules 1 groups");
  testing::expect_refused(
      1,
      [&] {
        return config("ternary", with({"compression.weight_bits=[2]",
                                       "compression.weight_type=\"asymmetric\""}));
      },
      "binary and ternary quantization are symmetric");
  testing::expect_refused(
      1, [&] { return config("act2", with({"compression.activation_bits=[2]"})); },
      "compression.activation_bits must be between 3 and 16, got 2");
  testing::expect_refused(
      1,
      [&] {
        return config("nomatch", with({"compression.weight_modules=[[\"c_fc\", \"dense\"]]"}));
      },
      "compression.weight_modules: 'dense' matches no linear layer");
}

}  // namespace compression_trainer_test
}  // namespace shardtrain
