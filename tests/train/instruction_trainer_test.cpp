// The trainer on instruction data (prompt/completion pairs, packed or padded): every strategy
// trains as one process on the same global batch of rows, a run resumes exactly at another
// world size, and bad data stops the run before the run directory is touched.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "shardtrain/train.h"
#include "support.h"
#include "train/local_training.h"
#include "train/run_config.h"

namespace shardtrain {
namespace instruction_trainer_test {

namespace fs = std::filesystem;

struct Layout {
  std::string name;
  int world;
  std::vector<std::string> keys;
};

class InstructionTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_instruction");
    // Question/answer pairs of varied lengths: rows hold one to several samples.
    std::ofstream data(dir_ / "pairs.jsonl");
    const char* words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"};
    for (int i = 0; i < 160; ++i) {
      std::string question = "Q" + std::to_string(i % 13) + ":", answer;
      for (int w = 0; w < 1 + i % 4; ++w) question += std::string(" ") + words[(i + w) % 8];
      for (int w = 0; w < 1 + (i * 5) % 7; ++w) answer += std::string(" ") + words[(i * w) % 8];
      data << "{\"prompt\": \"" << question << "\", \"completion\": \"" << answer << "\"}\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const Layout& layout, const std::string& run,
                     const std::vector<std::string>& more = {}) const {
    std::vector<std::string> all = {"data.format=\"prompt_completion\"",
                                    "model.vocab_size=260",
                                    "data.seq_len=64",
                                    "train.grad_accum=2",
                                    "train.micro_batch=4",
                                    "train.steps=4",
                                    "train.lr=3e-3",
                                    "train.eps=1e-6"};
    all.insert(all.end(), layout.keys.begin(), layout.keys.end());
    all.insert(all.end(), more.begin(), more.end());
    return testing::tiny_run_config(dir_ / "pairs.jsonl", dir_ / run, all);
  }

  fs::path dir_;
};

TEST_F(InstructionTrainerTest, EveryStrategyTrainsAsOneProcess) {
  for (const std::string packing : {"true", "false"}) {
    SCOPED_TRACE("packing " + packing);
    const Layout one{"one", 1, {"data.packing=" + packing}};
    const auto want = testing::train_on_ranks(1, config(one, "one" + packing), 4);
    for (const Layout& layout :
         {Layout{"ddp", 2, {"parallel.strategy=\"ddp\"", "train.micro_batch=2"}},
          Layout{"fsdp", 2, {"parallel.strategy=\"fsdp\"", "train.micro_batch=2"}},
          Layout{"zero2",
                 2,
                 {"parallel.strategy=\"zero\"", "parallel.zero.stage=2", "train.micro_batch=2"}},
          Layout{"tp2_sp", 2, {"parallel.tp=2", "parallel.sequence_parallel=true"}},
          Layout{"pp2", 2, {"parallel.pp=2"}},
          // Packed samples whose chunks fall on different ranks: segments travel with the keys.
          Layout{"cp2", 2, {"parallel.cp=2", "parallel.strategy=\"ddp\""}},
          Layout{"cp2_pp2", 4, {"parallel.cp=2", "parallel.pp=2", "parallel.strategy=\"ddp\""}},
          Layout{"cp2_fsdp2",
                 4,
                 {"parallel.cp=2", "parallel.strategy=\"fsdp\"", "train.micro_batch=2"}}}) {
      SCOPED_TRACE(layout.name);
      const auto got = testing::train_on_ranks(
          layout.world, config(layout, layout.name + packing, {"data.packing=" + packing}), 4);
      testing::expect_same_losses(got, want, 1e-5);
    }
  }
}

TEST_F(InstructionTrainerTest, ResumesExactlyAtAnotherWorldSize) {
  const Layout one{"one", 1, {}};
  const auto want = testing::train_on_ranks(1, config(one, "whole"), 4);
  std::string checkpoint;
  testing::train_on_ranks(1, config(one, "first"), 2, &checkpoint);
  const Layout ddp{"ddp", 2, {"parallel.strategy=\"ddp\"", "train.micro_batch=2"}};
  const auto rest =
      testing::train_on_ranks(2, config(ddp, "resumed", {"run.resume=\"" + checkpoint + "\""}), 2);
  testing::expect_same_losses(rest, {want[2], want[3]}, 1e-5);
}

TEST_F(InstructionTrainerTest, BadDataStopsTheRunBeforeItsDirectoryIsTouched) {
  std::ofstream(dir_ / "bad.jsonl") << "{\"prompt\": \"a\", \"completion\": \"b\"}\n"
                                    << "{\"prompt\": \"a\", \"answer\": \"b\"}\n";
  for (int world : {1, 2}) {
    const fs::path run = dir_ / ("bad_run_" + std::to_string(world));
    TrainConfig cfg = config({"", world,
                              world > 1 ? std::vector<std::string>{"parallel.strategy=\"ddp\""}
                                        : std::vector<std::string>{}},
                             run.filename().string());
    cfg.data.corpus = {(dir_ / "bad.jsonl").string()};
    testing::expect_refused(
        world, [&] { return cfg; }, world == 1 ? "line 2 has no string \"completion\"" : "");
    EXPECT_FALSE(fs::exists(run)) << "the run directory was created";
  }
}

// A tokenizer or a chat template the run cannot use is refused naming the file, before the run
// directory exists.
TEST_F(InstructionTrainerTest, AnUnusableTokenizerOrTemplateIsRefusedBeforeTheRun) {
  fs::create_directories(dir_ / "unigram");
  std::ofstream(dir_ / "unigram/tokenizer.json")
      << R"({"added_tokens": [], "normalizer": null, "pre_tokenizer": null,
             "post_processor": null, "decoder": null,
             "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0]]}})";
  std::ofstream(dir_ / "include.jinja") << "{% include 'turns.jinja' %}";
  std::ofstream(dir_ / "chat.jsonl")
      << R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
      << "\n";
  const Layout one{"one", 1, {}};
  const struct {
    std::vector<std::string> keys;
    std::string words;
  } cases[] = {
      {{"data.tokenizer=\"" + (dir_ / "unigram").string() + "\""}, "Unigram"},
      {{"data.format=\"chat\"", "data.chat_template=\"" + (dir_ / "include.jinja").string() + "\""},
       "include"},
      {{"data.format=\"chat\""}, "needs a chat template"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.words);
    TrainConfig cfg = config(one, "refused", c.keys);
    cfg.data.corpus = {(dir_ / "chat.jsonl").string()};
    testing::expect_refused(
        1, [&] { return cfg; }, c.words);
    EXPECT_FALSE(fs::exists(dir_ / "refused"));
  }
}

}  // namespace instruction_trainer_test
}  // namespace shardtrain
