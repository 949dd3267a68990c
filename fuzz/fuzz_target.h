// One fuzz target per parser that reads outside input. Each is a plain function, so that the test
// suite replays the seed corpora in fuzz/corpus/ through it; fuzz/entry.cpp makes each one the
// LLVMFuzzerTestOneInput of its own libFuzzer program (scripts/fuzz.sh).
//
// A target must return normally for every input: bad input is refused with
// std::invalid_argument, which the target catches. Anything else (a crash, a sanitizer report,
// another exception escaping) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace shardtrain::fuzz {

int train_config(const uint8_t* data, size_t size);
int deepspeed_config(const uint8_t* data, size_t size);
int accelerate_config(const uint8_t* data, size_t size);
int safetensors_header(const uint8_t* data, size_t size);
int checkpoint_index(const uint8_t* data, size_t size);
int hf_config(const uint8_t* data, size_t size);
int token_shard(const uint8_t* data, size_t size);
int sample_shard(const uint8_t* data, size_t size);
int instruction_jsonl(const uint8_t* data, size_t size);
int chat_template(const uint8_t* data, size_t size);
int hf_tokenizer(const uint8_t* data, size_t size);

// A scratch folder of this process under the system's temporary directory.
inline std::filesystem::path scratch_dir() {
  static const std::filesystem::path dir = [] {
    const auto path =
        std::filesystem::temp_directory_path() / ("shardtrain_fuzz_" + std::to_string(getpid()));
    std::filesystem::create_directories(path);
    return path;
  }();
  return dir;
}

// Writes the input to `name` in the scratch folder and returns its path.
inline std::string input_file(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace shardtrain::fuzz
