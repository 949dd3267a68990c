// Instruction data without a chat template: the sample shard, prompt/completion samples and
// their loss flags, JSONL errors, and packing samples into the loader's rows.
#include "shardtrain/samples.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "shardtrain/data.h"
#include "support.h"

namespace shardtrain {
namespace samples_test {

namespace fs = std::filesystem;

class SamplesTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::fresh_test_dir("shardtrain_samples"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }

  // Sample i has length lengths[i]; its token j is 1000 i + j (so a token names its sample and
  // place) and carries the loss when j >= prompt.
  std::shared_ptr<SampleShard> counting_samples(const std::vector<int64_t>& lengths,
                                                int64_t prompt = 2) {
    std::vector<int32_t> tokens;
    std::vector<uint8_t> loss;
    std::vector<int64_t> offsets = {0};
    for (size_t i = 0; i < lengths.size(); ++i) {
      for (int64_t j = 0; j < lengths[i]; ++j) {
        tokens.push_back(static_cast<int32_t>(1000 * i + j));
        loss.push_back(j >= prompt ? 1 : 0);
      }
      offsets.push_back(static_cast<int64_t>(tokens.size()));
    }
    write_sample_shard(path("samples.bin"), tokens, loss, offsets, 70000);
    return std::make_shared<SampleShard>(path("samples.bin"));
  }

  fs::path dir_;
};

TEST_F(SamplesTest, ShardRoundTripsAndRefusesCorruptFiles) {
  const auto shard = counting_samples({3, 5, 1});
  ASSERT_EQ(shard->num_samples(), 3);
  EXPECT_EQ(shard->num_tokens(), 9);
  EXPECT_EQ(shard->length(1), 5);
  std::vector<int64_t> ids(3);
  std::vector<uint8_t> loss(3);
  shard->read(1, 2, 3, ids.data(), loss.data());
  EXPECT_EQ(ids, (std::vector<int64_t>{1002, 1003, 1004}));
  EXPECT_EQ(loss, (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(shard->loss_tokens(1, 0, 5), 3);
  // Truncated, and offsets that do not rise: named with the file.
  fs::copy_file(path("samples.bin"), path("cut.bin"));
  fs::resize_file(path("cut.bin"), fs::file_size(path("cut.bin")) - 5);
  for (const auto& [file, words] : {std::pair<std::string, std::string>{"cut.bin", "truncated"},
                                    {"text.bin", "not a sample shard"}}) {
    if (file == "text.bin") write(file, std::string(64, 'x'));
    try {
      SampleShard bad(path(file));
      ADD_FAILURE() << file << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(path(file)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(write_sample_shard(path("x.bin"), {1, 2}, {0}, {0, 2}, 10), std::invalid_argument);
}

TEST_F(SamplesTest, PromptCompletionTakesTheLossOnTheCompletionAndItsEnd) {
  const auto bytes = make_byte_tokenizer();
  const TokenizedSample sample = tokenize_prompt_completion("Q: 2+2?", " 4", *bytes);
  ASSERT_EQ(sample.ids.size(), 7u + 2u + 1u);
  EXPECT_EQ(sample.ids.back(), bytes->eos_id());
  std::vector<int32_t> learned;
  for (size_t i = 0; i < sample.ids.size(); ++i) {
    if (sample.loss[i]) learned.push_back(sample.ids[i]);
  }
  EXPECT_EQ(bytes->decode(learned), " 4<|endoftext|>");
}

TEST_F(SamplesTest, MalformedLinesAreNamedWithFileAndLine) {
  const auto bytes = make_byte_tokenizer();
  auto error_of = [&](const std::string& text, DataFormat format) {
    const std::string file = write("data.jsonl", text);
    try {
      prepare_sample_shard({file}, format, *bytes, nullptr, path("out.bin"));
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const auto pc = DataFormat::kPromptCompletion;
  EXPECT_NE(error_of("{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": 1}\n", pc)
                .find("line 2 has no string \"prompt\""),
            std::string::npos);
  EXPECT_NE(error_of("\n{\"prompt\": \"a\"}\n", pc).find("line 2 has no string \"completion\""),
            std::string::npos);
  EXPECT_NE(error_of("{not json\n", pc).find("line 1 is not JSON"), std::string::npos);
  EXPECT_FALSE(fs::exists(path("out.bin")));
  EXPECT_THROW(prepare_sample_shard({path("data.jsonl")}, DataFormat::kChat, *bytes, nullptr,
                                    path("out.bin")),
               std::invalid_argument);  // chat data without a template
  // A good file: every sample written, the loss counted.
  const SampleStats stats =
      prepare_sample_shard({write("good.jsonl",
                                  "{\"prompt\": \"ab\", \"completion\": \"cde\"}\n\n"
                                  "{\"prompt\": \"\", \"completion\": \"x\"}\n")},
                           pc, *bytes, nullptr, path("good.bin"));
  EXPECT_EQ(stats.samples, 2);
  EXPECT_EQ(stats.tokens, 6 + 2);
  EXPECT_EQ(stats.loss_tokens, 4 + 2);
  EXPECT_EQ(SampleShard(path("good.bin")).num_samples(), 2);
}

// Rows hold whole samples, shifted within each sample, positions restarting, padding without a
// loss; over-long samples cut or dropped as asked.
TEST_F(SamplesTest, PackingKeepsSamplesWholeAndApart) {
  const std::vector<int64_t> lengths = {5, 9, 3, 12, 4, 2, 7, 1};
  const auto shard = counting_samples(lengths);
  for (bool drop : {false, true}) {
    SCOPED_TRACE(drop ? "drop" : "truncate");
    const DataLoader loader(
        shard, DataLoaderOptions().seq_len(8).micro_batch(1).pad_id(-7).drop_overlong(drop), 0, 1);
    const PackingStats& stats = loader.packing_stats();
    EXPECT_EQ(stats.samples, 8);
    EXPECT_EQ(stats.truncated, drop ? 0 : 1);  // 12 tokens exceed 8 + 1
    EXPECT_EQ(stats.dropped, drop ? 2 : 1);    // and the one-token sample has nothing to predict
    std::set<int64_t> seen;
    int64_t loss_tokens = 0, padding = 0;
    for (int64_t row = 0; row < loader.train_sequences(); ++row) {
      const Batch batch = loader.micro_batch(row, 0);
      ASSERT_TRUE(batch.layout.defined());
      for (int64_t t = 0; t < 8; ++t) {
        const int64_t in = batch.inputs[0][t].item<int64_t>();
        const int64_t target = batch.targets[0][t].item<int64_t>();
        const int64_t position = batch.layout.positions[0][t].item<int64_t>();
        const int64_t segment = batch.layout.segments[0][t].item<int64_t>();
        if (segment < 0) {  // padding: no loss
          EXPECT_EQ(in, -7);
          EXPECT_EQ(target, kIgnoreIndex);
          ++padding;
          continue;
        }
        // Input j of a sample is its token j, at position j; the target is token j + 1 when
        // that one carries the loss.
        EXPECT_EQ(in % 1000, position);
        EXPECT_TRUE(target == kIgnoreIndex || target == in + 1) << in << " -> " << target;
        EXPECT_EQ(target == kIgnoreIndex, position + 1 < 2);
        loss_tokens += target != kIgnoreIndex;
        seen.insert(in / 1000);
        if (t > 0 && batch.layout.segments[0][t - 1].item<int64_t>() == segment) {
          EXPECT_EQ(batch.inputs[0][t - 1].item<int64_t>(), in - 1);  // consecutive, same sample
        }
      }
    }
    EXPECT_EQ(loss_tokens, stats.loss_tokens);
    EXPECT_EQ(padding, stats.padding);
    EXPECT_EQ(seen.size(), drop ? 6u : 7u);
  }
}

// The global batch is the same rows at any number of ranks, and each micro-batch's loss divisor
// is the global batch's loss tokens over grad_accum x dp.
TEST_F(SamplesTest, GlobalBatchAndLossDivisorDoNotDependOnTheRanks) {
  std::vector<int64_t> lengths;
  for (int i = 0; i < 40; ++i) lengths.push_back(3 + (i * 7) % 11);
  const auto shard = counting_samples(lengths);
  const auto options = DataLoaderOptions().seq_len(12).grad_accum(2).seed(5).eval_sequences(2);
  for (int64_t step = 0; step < 3; ++step) {
    std::multiset<int64_t> one_rank, two_ranks;
    double one_divisor = 0, two_divisor = 0;
    const DataLoader whole(shard, DataLoaderOptions(options).micro_batch(4), 0, 1);
    int64_t loss_tokens = 0;
    for (int a = 0; a < 2; ++a) {
      const Batch batch = whole.micro_batch(step * 8, a);
      for (int64_t v : std::vector<int64_t>(batch.inputs.data_ptr<int64_t>(),
                                            batch.inputs.data_ptr<int64_t>() + 48)) {
        one_rank.insert(v);
      }
      loss_tokens += (batch.targets != kIgnoreIndex).sum().item<int64_t>();
      one_divisor = batch.loss_divisor;
    }
    EXPECT_DOUBLE_EQ(one_divisor, static_cast<double>(loss_tokens) / 2);
    for (int rank = 0; rank < 2; ++rank) {
      const DataLoader half(shard, DataLoaderOptions(options).micro_batch(2), rank, 2);
      for (int a = 0; a < 2; ++a) {
        const Batch batch = half.micro_batch(step * 8, a);
        for (int64_t v : std::vector<int64_t>(batch.inputs.data_ptr<int64_t>(),
                                              batch.inputs.data_ptr<int64_t>() + 24)) {
          two_ranks.insert(v);
        }
        two_divisor = batch.loss_divisor;
      }
    }
    EXPECT_EQ(one_rank, two_ranks) << "step " << step;
    EXPECT_DOUBLE_EQ(two_divisor, static_cast<double>(loss_tokens) / 4);
  }
}

TEST_F(SamplesTest, OneSamplePerRowIsPaddedWithoutALayout) {
  const auto shard = counting_samples({5, 3, 4});
  const DataLoader loader(shard, DataLoaderOptions().seq_len(6).micro_batch(3).packing(false), 0,
                          1);
  EXPECT_EQ(loader.packing_stats().rows, 3);
  EXPECT_EQ(loader.packing_stats().padding, 18 - (4 + 2 + 3));
  const Batch batch = loader.micro_batch(0, 0);
  EXPECT_FALSE(batch.layout.defined());
  for (int64_t b = 0; b < 3; ++b) {
    EXPECT_EQ(batch.inputs[b][0].item<int64_t>() % 1000, 0);  // every row starts a sample
    EXPECT_EQ(batch.targets[b][5].item<int64_t>(), kIgnoreIndex);
  }
}

}  // namespace samples_test
}  // namespace shardtrain
