// The trainer tests' runs: the tiny preset on the test's corpus, sequences of 32 tokens, two
// warmup steps, no sample at the end, four evaluation sequences.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "shardtrain/config.h"
#include "shardtrain/train.h"

namespace shardtrain::testing {

// The corpus of the trainer tests on either device (trainer_test.cpp, cuda_trainer_test.cpp):
// 200 short lines of a few repeating words and numbers.
inline void write_trainer_corpus(const std::filesystem::path& file) {
  std::ofstream corpus(file);
  for (int i = 0; i < 200; ++i) {
    corpus << "the quick brown fox " << i % 7 << " jumps over the lazy dog number " << i % 11
           << ".\n";
  }
}

// The losses of `trainer`'s next `steps` steps.
inline std::vector<double> step_losses(Trainer& trainer, int steps) {
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) out.push_back(trainer.train_step().loss);
  return out;
}

// `settings` ("section.key=value") follow those defaults and override them.
inline TrainConfig tiny_run_config(const std::filesystem::path& corpus,
                                   const std::filesystem::path& run,
                                   const std::vector<std::string>& settings) {
  std::vector<std::string> all = {"data.corpus=\"" + corpus.string() + "\"",
                                  "run.dir=\"" + run.string() + "\"",
                                  "data.seq_len=32",
                                  "train.warmup=2",
                                  "train.sample_tokens=0",
                                  "data.eval_sequences=4"};
  all.insert(all.end(), settings.begin(), settings.end());
  return parse_train_config("[model]\npreset = \"tiny\"\n", "test.toml", all);
}

// `steps` steps of two micro-batches of 2 sequences on one process (strategy "none"), or of 1
// sequence on each of 2 ranks under another strategy: the same global batches either way.
// `settings` follow.
inline TrainConfig two_micro_batch_config(const std::filesystem::path& corpus,
                                          const std::filesystem::path& run, int64_t steps,
                                          const std::string& strategy,
                                          const std::vector<std::string>& settings) {
  std::vector<std::string> all = {
      "train.grad_accum=2", "train.steps=" + std::to_string(steps), "train.lr=3e-3",
      "parallel.strategy=\"" + strategy + "\"",
      strategy == "none" ? "train.micro_batch=2" : "train.micro_batch=1"};
  all.insert(all.end(), settings.begin(), settings.end());
  return tiny_run_config(corpus, run, all);
}

}  // namespace shardtrain::testing
