// A trained model rebuilt from its checkpoint, and sampling text from it on one process.
#include "shardtrain/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/utils.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "checkpoint/model_description.h"
#include "model/layers.h"
#include "shardtrain/hf.h"
#include "shardtrain/lora.h"
#include "shardtrain/sharded_checkpoint.h"

namespace shardtrain {
namespace {

nlohmann::json metadata_of(const ShardedCheckpointReader& reader, const std::string& source) {
  try {
    const nlohmann::json metadata = nlohmann::json::parse(reader.metadata());
    if (metadata.is_object() && metadata.contains("model")) return metadata;
  } catch (const nlohmann::json::exception&) {
  }
  throw std::invalid_argument(source +
                              " was not written by the trainer (its metadata has no "
                              "model description)");
}

std::string training_string(const std::string& checkpoint_dir, const char* key) {
  const ShardedCheckpointReader reader(checkpoint_dir);
  const nlohmann::json metadata = metadata_of(reader, "checkpoint '" + checkpoint_dir + "'");
  const nlohmann::json training = metadata.value("training", nlohmann::json::object());
  return training.is_object() ? training.value(key, std::string()) : std::string();
}

}  // namespace

int64_t sample_token(at::Tensor logits, int64_t vocab, double temperature, int64_t top_k,
                     at::Generator& generator) {
  if (top_k < 0) {
    throw std::invalid_argument("top-k must be >= 0 (0: every id), got " + std::to_string(top_k));
  }
  logits = logits.to(at::kFloat);
  logits = logits.narrow(0, 0, std::min<int64_t>(logits.size(0), vocab)) / temperature;
  if (top_k > 0 && top_k < logits.size(0)) {
    const at::Tensor kth = std::get<0>(logits.topk(top_k)).min();
    logits = logits.masked_fill(logits < kth, -INFINITY);
  }
  return at::multinomial(logits.softmax(0), 1, false, generator).item<int64_t>();
}

Transformer load_trained_model(const std::string& checkpoint_dir) {
  const std::string source = "checkpoint '" + checkpoint_dir + "'";
  const ShardedCheckpointReader reader(checkpoint_dir);
  const nlohmann::json metadata = metadata_of(reader, source);
  const ModelConfig config = detail::model_from_description(metadata.at("model"), source);
  const nlohmann::json lora = metadata.value("lora", nlohmann::json());
  ModelInit init;
  if (lora.is_object()) {
    // The checkpoint holds the adapters; the base is what the run started from.
    init.seed(lora.value("seed", int64_t{0}));
    const std::string base = lora.value("init_from", std::string());
    if (!base.empty()) init.values(hf_initializer(config, base));
  }
  Transformer model(config, init);
  if (lora.is_object()) {
    add_lora(*model,
             LoraOptions()
                 .rank(lora.at("rank").get<int64_t>())
                 .alpha(lora.at("alpha").get<double>())
                 .target_modules(lora.at("target_modules").get<std::vector<std::string>>()));
    const std::string base_dtype = lora.value("base_dtype", std::string("fp32"));
    // The adapters learned against the base as the run stored it (NF4 rounds every weight).
    if (base_dtype != "fp32") detail::store_frozen_linears(*model, base_dtype);
  }
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    if (!reader.find(item.key())) {
      if (lora.is_object() && !item.value().requires_grad()) continue;  // the frozen base
      throw std::invalid_argument(source + " has no tensor '" + item.key() + "' of its model");
    }
    item.value().copy_(reader.read(item.key()).to(item.value().scalar_type()));
  }
  model->eval();
  return model;
}

std::string checkpoint_tokenizer(const std::string& checkpoint_dir) {
  return training_string(checkpoint_dir, "tokenizer_path");
}

std::string checkpoint_chat_template(const std::string& checkpoint_dir) {
  return training_string(checkpoint_dir, "chat_template");
}

void require_text_generation(const ModelConfig& config) {
  if (config.bidirectional()) {
    throw std::invalid_argument("the " + to_string(config.family) +
                                " model is a masked-language model: it fills in masked tokens "
                                "and does not continue text");
  }
}

std::string generate_text(Transformer& model, const Tokenizer& tokenizer,
                          const ChatTemplate* chat_template, const std::string& prompt,
                          const SampleOptions& options) {
  require_text_generation(model->config());
  if (!(options.temperature_ > 0) || !std::isfinite(options.temperature_)) {
    throw std::invalid_argument("sampling temperature must be a positive finite number, got " +
                                std::to_string(options.temperature_));
  }
  if (options.tokens_ < 0) {
    throw std::invalid_argument("the number of tokens to generate must be >= 0, got " +
                                std::to_string(options.tokens_));
  }
  torch::NoGradGuard no_grad;
  model->eval();
  const std::string text =
      chat_template ? chat_template->render({ChatMessage{"user", prompt}}, true) : prompt;
  if (options.on_text_) options.on_text_(text);
  std::vector<int32_t> ids = tokenizer.encode(text, /*add_special=*/chat_template == nullptr);
  if (ids.empty()) ids.push_back(tokenizer.eos_id());
  const size_t prompt_length = ids.size();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed_);
  const int64_t context = model->config().context_length;
  // What on_text has been given: the decoded continuation up to its last whole character.
  std::string shown;
  auto show = [&](bool last) {
    if (!options.on_text_) return;
    const std::vector<int32_t> generated(ids.begin() + static_cast<int64_t>(prompt_length),
                                         ids.end());
    const std::string decoded = tokenizer.decode(generated);
    // A token that ends inside a character decodes to U+FFFD until the rest arrives.
    const bool partial =
        decoded.size() >= 3 && decoded.compare(decoded.size() - 3, 3, "\xEF\xBF\xBD") == 0;
    if ((partial && !last) || decoded.size() <= shown.size() ||
        decoded.compare(0, shown.size(), shown) != 0) {
      return;
    }
    options.on_text_(decoded.substr(shown.size()));
    shown = decoded;
  };
  for (int64_t i = 0; i < options.tokens_; ++i) {
    const int64_t start = std::max<int64_t>(0, static_cast<int64_t>(ids.size()) - context);
    const at::Tensor window =
        at::tensor(std::vector<int64_t>(ids.begin() + start, ids.end()), at::kLong).unsqueeze(0);
    const at::Tensor logits = model->forward(window)[0][-1];
    const auto next = static_cast<int32_t>(sample_token(
        logits, tokenizer.vocab_size(), options.temperature_, options.top_k_, generator));
    if (chat_template ? tokenizer.is_special(next) : next == tokenizer.eos_id()) break;
    ids.push_back(next);
    show(false);
  }
  show(true);
  const std::vector<int32_t> generated(ids.begin() + static_cast<int64_t>(prompt_length),
                                       ids.end());
  return text + tokenizer.decode(generated);
}

}  // namespace shardtrain
