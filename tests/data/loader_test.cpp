#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "shardtrain/data.h"
#include "support.h"

namespace shardtrain {
namespace loader_test {

namespace fs = std::filesystem;

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::fresh_test_dir("shardtrain_loader"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A shard whose token i is i % vocab, so a sequence's first token tells where it starts.
  std::shared_ptr<TokenShard> counting_shard(int64_t tokens, int64_t vocab = 60000) {
    std::vector<int32_t> ids(tokens);
    for (int64_t i = 0; i < tokens; ++i) ids[i] = static_cast<int32_t>(i % vocab);
    write_token_shard(path("counting.tokens"), ids, vocab);
    return std::make_shared<TokenShard>(path("counting.tokens"));
  }

  fs::path dir_;
};

TEST_F(LoaderTest, ShardRoundTripsSixteenAndThirtyTwoBitTokens) {
  const std::vector<int32_t> small = {0, 1, 50256, 65535, 7};
  write_token_shard(path("a.tokens"), small, 65536);
  TokenShard a(path("a.tokens"));
  EXPECT_EQ(a.header().token_bytes, 2u);
  EXPECT_TRUE(at::equal(a.read(0, 5), at::tensor({0, 1, 50256, 65535, 7}, at::kLong)));

  const std::vector<int32_t> large = {128000, 3, 70000};
  write_token_shard(path("b.tokens"), large, 128256);
  TokenShard b(path("b.tokens"));
  EXPECT_EQ(b.header().token_bytes, 4u);
  EXPECT_EQ(b.read(0, 3)[2].item<int64_t>(), 70000);
}

// A token id the header's vocabulary does not have is named with the file and its place.
TEST_F(LoaderTest, AnIdOutsideTheShardsVocabularyIsNamedWithItsPlace) {
  write_token_shard(path("bad.tokens"), {1, 2, 300, 4}, 257);
  const TokenShard shard(path("bad.tokens"));
  EXPECT_TRUE(at::equal(shard.read(0, 2), at::tensor({1, 2}, at::kLong)));
  try {
    shard.read(1, 3);
    FAIL() << "token id 300 of a 257-token vocabulary was read";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path("bad.tokens")), std::string::npos) << message;
    EXPECT_NE(message.find("holds token id 300 at token 2, outside the vocabulary of 257"),
              std::string::npos)
        << message;
  }
}

TEST_F(LoaderTest, TruncatedShardIsRefusedNamingTheFile) {
  write_token_shard(path("t.tokens"), std::vector<int32_t>(100, 5), 257);
  fs::resize_file(path("t.tokens"), fs::file_size(path("t.tokens")) - 3);
  try {
    TokenShard shard(path("t.tokens"));
    FAIL() << "a truncated shard was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(path("t.tokens")), std::string::npos) << message;
    EXPECT_NE(message.find("truncated"), std::string::npos) << message;
    EXPECT_NE(message.find("100 tokens"), std::string::npos) << message;
  }
  // A corrupt count of 2^63 - 1 tokens is called truncated, not wrapped into "trailing bytes".
  {
    std::fstream file(path("t.tokens"), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(16);
    const uint64_t huge = (uint64_t{1} << 63) - 1;
    file.write(reinterpret_cast<const char*>(&huge), sizeof(huge));
  }
  try {
    TokenShard shard(path("t.tokens"));
    FAIL() << "a shard announcing 2^63 - 1 tokens was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("is truncated: its header announces 9223372036854775807 tokens"),
              std::string::npos)
        << message;
  }
  std::ofstream(path("text.tokens")) << "this is text, not tokens";
  EXPECT_THROW(TokenShard(path("text.tokens")), std::invalid_argument);
  EXPECT_THROW(TokenShard(path("missing.tokens")), std::invalid_argument);
}

TEST_F(LoaderTest, PrepareWritesOneDocumentPerFileWithEndOfText) {
  std::ofstream(path("one.txt")) << "ab";
  std::ofstream(path("two.txt")) << "c";
  auto tokenizer = make_byte_tokenizer();
  EXPECT_EQ(prepare_token_shard({path("one.txt"), path("two.txt")}, *tokenizer, path("o.tokens")),
            5);
  TokenShard shard(path("o.tokens"));
  EXPECT_TRUE(at::equal(shard.read(0, 5), at::tensor({97, 98, 256, 99, 256}, at::kLong)));
  EXPECT_THROW(prepare_token_shard({path("nope.txt")}, *tokenizer, path("x.tokens")),
               std::invalid_argument);
}

TEST_F(LoaderTest, BatchesAreDeterministicForASeedAndDifferAcrossSeeds) {
  auto shard = counting_shard(10000);
  const auto options = DataLoaderOptions().seq_len(16).micro_batch(4).seed(7);
  DataLoader a(shard, options), b(shard, options), c(shard, DataLoaderOptions(options).seed(8));
  for (int64_t step = 0; step < 5; ++step) {
    EXPECT_TRUE(at::equal(a.micro_batch(step * 4, 0).inputs, b.micro_batch(step * 4, 0).inputs));
  }
  EXPECT_FALSE(at::equal(a.micro_batch(0, 0).inputs, c.micro_batch(0, 0).inputs));
  const Batch batch = a.micro_batch(0, 0);
  EXPECT_TRUE(at::equal(batch.targets.narrow(1, 0, 15), batch.inputs.narrow(1, 1, 15)));
}

// The set of sequence start positions of the global batch of one step.
std::multiset<int64_t> global_batch(const std::shared_ptr<TokenShard>& shard, int dp, int64_t micro,
                                    int64_t accum, int64_t step,
                                    std::vector<std::set<int64_t>>* per_rank = nullptr) {
  std::multiset<int64_t> starts;
  for (int r = 0; r < dp; ++r) {
    DataLoader loader(
        shard, DataLoaderOptions().seq_len(8).micro_batch(micro).grad_accum(accum).seed(3), r, dp);
    for (int a = 0; a < accum; ++a) {
      const Batch batch = loader.micro_batch(step * loader.global_batch_size(), a);
      for (int64_t i = 0; i < batch.inputs.size(0); ++i) {
        starts.insert(batch.inputs[i][0].item<int64_t>());
        if (per_rank) (*per_rank)[r].insert(batch.inputs[i][0].item<int64_t>());
      }
    }
  }
  return starts;
}

TEST_F(LoaderTest, GlobalBatchIsTheSameForAnyDataParallelSizeAndRanksAreDisjoint) {
  auto shard = counting_shard(8 * 500 + 1);
  for (int64_t step : {0, 3, 70}) {  // step 70 crosses into the second epoch
    const auto one = global_batch(shard, 1, 8, 1, step);
    EXPECT_EQ(global_batch(shard, 2, 4, 1, step), one);
    EXPECT_EQ(global_batch(shard, 4, 1, 2, step), one);
    std::vector<std::set<int64_t>> per_rank(4);
    global_batch(shard, 4, 2, 1, step, &per_rank);
    std::set<int64_t> all;
    for (const auto& rank : per_rank) {
      for (int64_t start : rank) EXPECT_TRUE(all.insert(start).second) << "ranks overlap";
    }
    EXPECT_EQ(all.size(), 8u);
  }
}

TEST_F(LoaderTest, EvaluationSequencesAreHeldOut) {
  auto shard = counting_shard(16 * 20 + 1);
  DataLoader loader(shard, DataLoaderOptions().seq_len(16).micro_batch(4).eval_sequences(4));
  EXPECT_EQ(loader.train_sequences(), 16);
  std::set<int64_t> train_starts;
  for (int64_t step = 0; step < 4; ++step) {
    const Batch batch = loader.micro_batch(step * 4, 0);
    for (int64_t i = 0; i < 4; ++i) train_starts.insert(batch.inputs[i][0].item<int64_t>());
  }
  const Batch eval = loader.eval_batch(0);
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(train_starts.count(eval.inputs[i][0].item<int64_t>()), 0u);
    EXPECT_GE(eval.inputs[i][0].item<int64_t>(), 16 * 16);
  }
  EXPECT_THROW(DataLoader(shard, DataLoaderOptions().seq_len(16).eval_sequences(20)),
               std::invalid_argument);
}

// Masked-language-model batches: each position chosen with the probability, 8 in 10 of the
// chosen masked, 1 in 10 replaced by a random id, 1 kept; targets the original tokens at the
// chosen positions alone; the same sequences masked alike at any data-parallel size, and the
// divisor the global batch's chosen positions over the micro-batches.
TEST_F(LoaderTest, MaskedLmBatchesChooseMaskAndReplaceAtBertsRates) {
  auto shard = counting_shard(128 * 100 + 1);
  const int64_t mask_id = 60000;
  auto options = [&](int64_t micro_batch) {
    return DataLoaderOptions()
        .seq_len(128)
        .micro_batch(micro_batch)
        .seed(5)
        .masked_lm({0.15, mask_id, 1000, {}});
  };
  const DataLoader plain(shard, DataLoaderOptions().seq_len(128).micro_batch(64).seed(5));
  const DataLoader masked(shard, options(64));
  const Batch original = plain.micro_batch(0, 0);
  const Batch batch = masked.micro_batch(0, 0);
  int64_t chosen = 0, as_mask = 0, as_random = 0, kept = 0;
  for (int64_t i = 0; i < 64; ++i) {
    for (int64_t t = 0; t < 128; ++t) {
      const int64_t in = batch.inputs[i][t].item<int64_t>();
      const int64_t target = batch.targets[i][t].item<int64_t>();
      const int64_t was = original.inputs[i][t].item<int64_t>();
      if (target == kIgnoreIndex) {
        ASSERT_EQ(in, was) << "an unchosen position changed";
        continue;
      }
      ASSERT_EQ(target, was) << "a target is not the original token";
      ++chosen;
      if (in == mask_id) {
        ++as_mask;
      } else if (in == was) {
        ++kept;
      } else {
        ASSERT_LT(in, 1000) << "a random replacement outside the ids it is drawn from";
        ++as_random;
      }
    }
  }
  const double positions = 64.0 * 128.0;
  EXPECT_NEAR(chosen / positions, 0.15, 0.015);
  EXPECT_NEAR(static_cast<double>(as_mask) / chosen, 0.8, 0.04);
  EXPECT_NEAR(static_cast<double>(as_random) / chosen, 0.1, 0.03);
  EXPECT_NEAR(static_cast<double>(kept) / chosen, 0.1, 0.03);
  EXPECT_DOUBLE_EQ(batch.loss_divisor, static_cast<double>(chosen));

  // Two ranks of 32 sequences: the same rows, masked alike; each divisor half the global count.
  const DataLoader rank0(shard, options(32), 0, 2), rank1(shard, options(32), 1, 2);
  const Batch a = rank0.micro_batch(0, 0), b = rank1.micro_batch(0, 0);
  EXPECT_TRUE(at::equal(at::cat({a.inputs, b.inputs}), batch.inputs));
  EXPECT_TRUE(at::equal(at::cat({a.targets, b.targets}), batch.targets));
  EXPECT_DOUBLE_EQ(a.loss_divisor, chosen / 2.0);
  EXPECT_DOUBLE_EQ(b.loss_divisor, chosen / 2.0);

  // Another step masks its sequences afresh; held-out batches are masked the same each time.
  EXPECT_FALSE(at::equal(masked.micro_batch(64, 0).targets, batch.targets));
  const DataLoader with_eval(shard, options(4).eval_sequences(8));
  const Batch eval = with_eval.eval_batch(0);
  EXPECT_TRUE(at::equal(eval.targets, with_eval.eval_batch(0).targets));
  EXPECT_DOUBLE_EQ(eval.loss_divisor, (eval.targets != kIgnoreIndex).sum().item<double>());
  EXPECT_THROW(DataLoader(shard, DataLoaderOptions().masked_lm({0.15, -1, 1000, {}})),
               std::invalid_argument);

  // Special tokens (here every multiple of 3) are never chosen; the others at the same rate, and
  // the divisor counts what was chosen, over every micro-batch of the step.
  DataLoaderOptions::MaskedLm special{0.15, mask_id, 1000, {}};
  for (int64_t id = 0; id < 60000; id += 3) special.unmasked.push_back(id);
  const DataLoader skipping(shard, options(16).masked_lm(special).grad_accum(4));
  const DataLoader unmasked(shard,
                            DataLoaderOptions().seq_len(128).micro_batch(16).seed(5).grad_accum(4));
  int64_t chosen_in_step = 0, others = 0;
  std::vector<double> divisors;
  for (int micro = 0; micro < 4; ++micro) {
    const Batch part = skipping.micro_batch(0, micro);
    const at::Tensor picked = part.targets != kIgnoreIndex;
    EXPECT_EQ((part.targets.masked_select(picked) % 3 == 0).sum().item<int64_t>(), 0);
    chosen_in_step += picked.sum().item<int64_t>();
    others += (unmasked.micro_batch(0, micro).inputs % 3 != 0).sum().item<int64_t>();
    divisors.push_back(part.loss_divisor);
  }
  EXPECT_NEAR(static_cast<double>(chosen_in_step) / others, 0.15, 0.015);
  for (const double divisor : divisors) {
    EXPECT_DOUBLE_EQ(divisor * 4, static_cast<double>(chosen_in_step));
  }
  special.unmasked = {5, 3};
  EXPECT_THROW(DataLoader(shard, options(4).masked_lm(special)), std::invalid_argument);
}

}  // namespace loader_test
}  // namespace shardtrain
