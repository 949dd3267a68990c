// The trainer tests' runs: the tiny preset on the test's corpus, sequences of 32 tokens, two
// warmup steps, no sample at the end, four evaluation sequences.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "shardtrain/config.h"

namespace shardtrain::testing {

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

}  // namespace shardtrain::testing
