#include "train/run_data.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "shardtrain/hf_tokenizer.h"
#include "shardtrain/sharded_checkpoint.h"

namespace fs = std::filesystem;

namespace shardtrain::detail {
namespace {

bool has_magic(const std::string& path, const char (&magic)[9]) {
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  return in.read(head, 8) && std::string(head, 8) == magic;
}

// The folder a tokenizer.json or model folder path stands for.
fs::path model_folder(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error) ? fs::path(path) : fs::path(path).parent_path();
}

nlohmann::json stamped(const std::string& path) {
  std::error_code error;
  const auto stamp = fs::last_write_time(path, error).time_since_epoch().count();
  return {{"path", fs::absolute(path).string()}, {"mtime", stamp}};
}

// What a tokenized corpus was made from: when it differs, the corpus is made again.
nlohmann::json made_from(const TrainConfig& config, const Tokenizer& tokenizer,
                         const ChatTemplate* chat_template) {
  nlohmann::json inputs = nlohmann::json::array();
  for (const auto& input : config.data.corpus) inputs.push_back(stamped(input));
  nlohmann::json made = {{"tokenizer", tokenizer.name()}, {"inputs", inputs}};
  if (config.data.format != "text") {
    made["format"] = config.data.format;
    if (chat_template && config.data.format == "chat")
      made["chat_template"] = stamped(chat_template->origin());
  }
  return made;
}

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return nullptr;
  try {
    nlohmann::json json;
    in >> json;
    return json;
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace

std::string tokenizer_source(const TrainConfig& config) {
  if (!config.data.tokenizer.empty()) return config.data.tokenizer;
  if (!config.model.init_from.empty() &&
      is_hf_tokenizer_path(model_folder(config.model.init_from).string())) {
    return model_folder(config.model.init_from).string();
  }
  return "byte";
}

std::string tokenizer_path(const TrainConfig& config) {
  const std::string source = tokenizer_source(config);
  if (source == "byte") return source;
  if (source == "gpt2") {
    return config.data.gpt2_dir.empty() ? source
                                        : "gpt2:" + fs::absolute(config.data.gpt2_dir).string();
  }
  return fs::absolute(source).string();
}

std::unique_ptr<Tokenizer> make_tokenizer(const TrainConfig& config) {
  return shardtrain::make_tokenizer(tokenizer_source(config), config.data.gpt2_dir);
}

std::unique_ptr<ChatTemplate> make_chat_template(const TrainConfig& config) {
  if (!config.data.chat_template.empty()) {
    return std::make_unique<ChatTemplate>(
        ChatTemplate::from_model_files(config.data.chat_template));
  }
  const std::string tokenizer = tokenizer_source(config);
  if (tokenizer != "byte" && tokenizer != "gpt2") {
    const fs::path folder = model_folder(tokenizer);
    if (fs::exists(folder / "chat_template.jinja") ||
        fs::exists(folder / "tokenizer_config.json")) {
      try {
        return std::make_unique<ChatTemplate>(ChatTemplate::from_model_files(folder.string()));
      } catch (const std::invalid_argument&) {
        // A tokenizer_config.json without a template: only an error when chat data needs one.
        if (config.data.format == "chat") throw;
      }
    }
  }
  if (config.data.format == "chat") {
    throw std::invalid_argument(
        "data.format \"chat\" needs a chat template: the tokenizer '" + tokenizer +
        "' has none beside it; set data.chat_template to a tokenizer_config.json, a "
        "chat_template.jinja or a model folder");
  }
  return nullptr;
}

std::string TrainingData::describe() const {
  if (tokens) {
    return std::to_string(tokens->size()) + " tokens of '" + tokens->path() + "'";
  }
  return std::to_string(samples->num_samples()) + " samples (" +
         std::to_string(samples->num_tokens()) + " tokens) of '" + samples->path() + "'";
}

TrainingData open_prepared_data(const TrainConfig& config) {
  if (config.data.corpus.empty()) {
    throw std::invalid_argument("data.corpus is not set (a token shard, text files or folders)");
  }
  const std::string& first = config.data.corpus[0];
  std::error_code error;
  if (config.data.corpus.size() == 1 && fs::is_regular_file(first, error)) {
    if (config.data.format == "text" && has_magic(first, "STTOKENS")) {
      return {std::make_shared<TokenShard>(first), nullptr};
    }
    if (config.data.format != "text" && has_magic(first, "STSAMPLE")) {
      return {nullptr, std::make_shared<SampleShard>(first)};
    }
  }
  for (const auto& input : config.data.corpus) {
    if (!fs::exists(input, error)) {
      throw std::invalid_argument("data.corpus: '" + input + "' does not exist");
    }
  }
  return {};
}

namespace {

fs::path shard_path(const TrainConfig& config) {
  return fs::path(config.run.dir) /
         (config.data.format == "text" ? "corpus.tokens" : "samples.bin");
}

}  // namespace

TokenizedData tokenize_data(const TrainConfig& config, const Tokenizer& tokenizer,
                            const ChatTemplate* chat_template, bool dir_kept) {
  TokenizedData data;
  data.made_from = made_from(config, tokenizer, chat_template).dump();
  const fs::path shard = shard_path(config);
  const nlohmann::json existing = read_json(shard.string() + ".json");
  if (dir_kept && existing.is_object() &&
      existing.value("made_from", nlohmann::json()).dump() == data.made_from && fs::exists(shard)) {
    data.current = true;
    return data;
  }
  if (config.data.format == "text") {
    data.tokens = tokenize_corpus(config.data.corpus, tokenizer);
  } else {
    data.samples = tokenize_samples(config.data.corpus, data_format_from_string(config.data.format),
                                    tokenizer, chat_template);
  }
  return data;
}

TrainingData store_data(const TrainConfig& config, const TokenizedData& tokenized,
                        int64_t vocab_size) {
  if (!tokenized.current) {
    const fs::path shard = shard_path(config);
    nlohmann::json record = {{"made_from", nlohmann::json::parse(tokenized.made_from)}};
    if (config.data.format == "text") {
      write_token_shard(shard.string(), tokenized.tokens, vocab_size);
    } else {
      const TokenizedSamples& samples = tokenized.samples;
      write_sample_shard(shard.string(), samples.tokens, samples.loss, samples.offsets, vocab_size);
      record["samples"] = samples.stats.samples;
      record["tokens"] = samples.stats.tokens;
      record["loss_tokens"] = samples.stats.loss_tokens;
    }
    std::ofstream(shard.string() + ".json") << record.dump(2) << "\n";
  }
  return open_data(config);
}

TrainingData open_data(const TrainConfig& config) {
  const fs::path shard = shard_path(config);
  if (config.data.format == "text") return {std::make_shared<TokenShard>(shard.string()), nullptr};
  return {nullptr, std::make_shared<SampleShard>(shard.string())};
}

namespace {

// A tokenizer's name without the folder it was read from: "tokenizer.json BPE (...) [digest]"
// for Hugging Face files (the digest is of their contents), the name itself otherwise.
std::string tokenizer_identity(const std::string& name) {
  const size_t from = name.find(" from ");
  const size_t digest = name.rfind(" [");
  if (from == std::string::npos || digest == std::string::npos || digest < from) return name;
  return name.substr(0, from) + name.substr(digest);
}

}  // namespace

void check_resume_tokenizer(const std::string& checkpoint, const Tokenizer& tokenizer) {
  const ShardedCheckpointReader reader(checkpoint);
  nlohmann::json metadata;
  try {
    metadata = nlohmann::json::parse(reader.metadata());
  } catch (const nlohmann::json::exception&) {
    return;  // the load names what is wrong with it
  }
  const nlohmann::json training = metadata.value("training", nlohmann::json::object());
  const std::string saved = training.is_object() ? training.value("tokenizer", "") : "";
  if (saved.empty() || tokenizer_identity(saved) == tokenizer_identity(tokenizer.name())) return;
  throw std::invalid_argument("run.resume: checkpoint '" + checkpoint + "' was trained with the " +
                              saved + " tokenizer, and this run's data.tokenizer is the " +
                              tokenizer.name() +
                              " one: a resumed run keeps its tokenizer; set data.tokenizer "
                              "back, or start a new run (another run.dir, or run.overwrite)");
}

int64_t mask_token_id(const Tokenizer& tokenizer) {
  for (const char* token : {"[MASK]", "<mask>"}) {
    const int32_t id = tokenizer.token_id(token);
    if (id >= 0) return id;
  }
  return tokenizer.vocab_size();
}

std::unique_ptr<DataLoader> make_loader(const TrainConfig& config, const TrainingData& data,
                                        const Tokenizer& tokenizer, int dp_rank, int dp_size) {
  DataLoaderOptions::MaskedLm masked;
  if (config.model.bidirectional()) {
    masked.probability = config.train.mlm_probability;
    masked.mask_id = mask_token_id(tokenizer);
    masked.random_ids = tokenizer.vocab_size();
    // As Hugging Face's collator: special tokens (end of text, [CLS], [SEP], ...) are not chosen.
    for (int64_t id = 0; id < tokenizer.vocab_size(); ++id) {
      if (tokenizer.is_special(static_cast<int32_t>(id))) masked.unmasked.push_back(id);
    }
  }
  const DataLoaderOptions options = DataLoaderOptions()
                                        .masked_lm(masked)
                                        .seq_len(config.data.seq_len)
                                        .micro_batch(config.train.micro_batch)
                                        .grad_accum(config.train.grad_accum)
                                        .seed(static_cast<uint64_t>(config.train.seed))
                                        .eval_sequences(config.data.eval_sequences)
                                        .packing(config.data.packing)
                                        .drop_overlong(config.data.overlong == "drop")
                                        .pad_id(tokenizer.eos_id());
  if (data.tokens) return std::make_unique<DataLoader>(data.tokens, options, dp_rank, dp_size);
  return std::make_unique<DataLoader>(data.samples, options, dp_rank, dp_size);
}

}  // namespace shardtrain::detail
