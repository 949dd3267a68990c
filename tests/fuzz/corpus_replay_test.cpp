// Every seed and regression input of the fuzz corpora (fuzz/corpus/TARGET/) goes through its
// target on every test run, so an input that once crashed a parser keeps being checked without
// a fuzzing build.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>

#include "fuzz_target.h"

namespace shardtrain {
namespace corpus_replay_test {

namespace fs = std::filesystem;

TEST(FuzzCorpusReplay, EveryCorpusInputIsHandled) {
  const std::map<std::string, std::function<int(const uint8_t*, size_t)>> targets = {
      {"train_config", fuzz::train_config},
      {"deepspeed_config", fuzz::deepspeed_config},
      {"accelerate_config", fuzz::accelerate_config},
      {"safetensors_header", fuzz::safetensors_header},
      {"checkpoint_index", fuzz::checkpoint_index},
      {"hf_config", fuzz::hf_config},
      {"token_shard", fuzz::token_shard},
      {"sample_shard", fuzz::sample_shard},
      {"instruction_jsonl", fuzz::instruction_jsonl},
      {"chat_template", fuzz::chat_template},
      {"hf_tokenizer", fuzz::hf_tokenizer}};
  const fs::path root = fs::path(SHARDTRAIN_SOURCE_DIR) / "fuzz" / "corpus";
  for (const auto& [name, target] : targets) {
    int inputs = 0;
    for (const auto& entry : fs::directory_iterator(root / name)) {
      SCOPED_TRACE(entry.path().string());
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
      // A target returns normally for every input: bad ones are refused inside it.
      EXPECT_NO_THROW(target(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
      ++inputs;
    }
    EXPECT_GT(inputs, 0) << "no corpus for " << name;
  }
  fs::remove_all(fuzz::scratch_dir());
}

}  // namespace corpus_replay_test
}  // namespace shardtrain
