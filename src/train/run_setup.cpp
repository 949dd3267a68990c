#include "train/run_setup.h"

#include <malloc.h>

#include <cstdlib>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace fs = std::filesystem;

namespace shardtrain::detail {
namespace {

bool is_token_shard(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  return in.read(magic, 8) && std::string(magic, 8) == "STTOKENS";
}

int64_t status_field_kib(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size()));
  }
  return 0;
}

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const TrainConfig& config) {
  if (config.tokenizer == "byte") return make_byte_tokenizer();
  const fs::path dir = config.gpt2_dir.empty() ? default_gpt2_dir() : config.gpt2_dir;
  return make_gpt2_tokenizer((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
}

std::shared_ptr<TokenShard> open_token_shard_corpus(const TrainConfig& config) {
  if (config.corpus.empty()) {
    throw std::invalid_argument("data.corpus is not set (a token shard, text files or folders)");
  }
  if (config.corpus.size() == 1 && fs::is_regular_file(config.corpus[0]) &&
      is_token_shard(config.corpus[0])) {
    return std::make_shared<TokenShard>(config.corpus[0]);
  }
  for (const auto& input : config.corpus) {
    std::error_code error;
    if (!fs::exists(input, error)) {
      throw std::invalid_argument("data.corpus: '" + input + "' does not exist");
    }
  }
  return nullptr;
}

std::shared_ptr<TokenShard> open_corpus(const TrainConfig& config, const Tokenizer& tokenizer) {
  if (auto shard = open_token_shard_corpus(config)) return shard;
  // Tokenizing takes a while; the shard is kept beside a description of what it was made from.
  nlohmann::json made_from = {{"tokenizer", tokenizer.name()}, {"inputs", nlohmann::json::array()}};
  for (const auto& input : config.corpus) {
    std::error_code error;
    const auto stamp = fs::last_write_time(input, error).time_since_epoch().count();
    made_from["inputs"].push_back({{"path", fs::absolute(input).string()}, {"mtime", stamp}});
  }
  const fs::path shard = fs::path(config.dir) / "corpus.tokens";
  const fs::path sidecar = fs::path(config.dir) / "corpus.tokens.json";
  nlohmann::json existing;
  if (std::ifstream in(sidecar); in) {
    try {
      in >> existing;
    } catch (const std::exception&) {
      existing = nullptr;
    }
  }
  if (existing != made_from || !fs::exists(shard)) {
    prepare_token_shard(config.corpus, tokenizer, shard.string());
    std::ofstream(sidecar) << made_from.dump(2) << "\n";
  }
  return std::make_shared<TokenShard>(shard.string());
}

bool return_memory_promptly(const TrainConfig& config) {
#ifdef __GLIBC__
  const bool in_files = config.strategy == "zero" && (config.zero_offload_param == "nvme" ||
                                                      config.zero_offload_optimizer == "nvme");
  if (!in_files || std::getenv("MALLOC_MMAP_MAX_") || std::getenv("MALLOC_TRIM_THRESHOLD_")) {
    return false;
  }
  mallopt(M_MMAP_MAX, 1 << 20);
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  mallopt(M_TRIM_THRESHOLD, 4 << 20);
  return true;
#else
  (void)config;
  return false;
#endif
}

void trim_heap() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

int64_t resident_bytes() { return status_field_kib("VmRSS") * 1024; }
int64_t peak_resident_bytes() { return status_field_kib("VmHWM") * 1024; }

bool on_any_rank(ProcessGroup& group, bool value) {
  at::Tensor any = at::tensor(value ? 1.0 : 0.0, at::kDouble);
  group.all_reduce(any, ReduceOp::kMax)->wait();
  return any.item<double>() > 0;
}

std::string optimizer_state_key(const at::Tensor& parameter) {
  std::ostringstream key;
  key << parameter.unsafeGetTensorImpl();
  return key.str();
}

LoraOptions lora_options(const TrainConfig& config) {
  return LoraOptions()
      .rank(config.lora_rank)
      .alpha(config.lora_alpha)
      .dropout(config.lora_dropout)
      .target_modules(config.lora_target_modules);
}

}  // namespace shardtrain::detail
