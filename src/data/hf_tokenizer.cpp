// A Hugging Face tokenizer.json tokenizer: loading (with tokenizer_config.json beside it) and the
// encode pipeline of the `tokenizers` library (TokenizerImpl::encode_single_sequence):
//   1. added tokens whose "normalized" is false are split out of the raw text;
//   2. each remaining segment is normalized, then the normalized added tokens are split out;
//   3. each remaining segment is pre-tokenized, and each piece goes through the model (BPE, or
//      WordPiece);
//   4. with add_special, the post-processor's (or tokenizer_config.json's) tokens go around.
//
// Text that is not valid UTF-8 (which `tokenizers` cannot be given) goes through the same steps:
// normalizers and patterns leave the invalid bytes alone, and the model makes each one its byte
// token (byte-level) or <0xNN> token (byte fallback).
#include "shardtrain/hf_tokenizer.h"

#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "data/hf_tokenizer.h"

namespace shardtrain {
namespace detail {
namespace {

namespace fs = std::filesystem;

// Bounds added token ids as the model bounds its own.
constexpr int64_t kMaxAddedId = (int64_t{1} << 24) - 1;

// A special token of tokenizer_config.json: a string, {"content": ...} (transformers' saved
// AddedToken), or absent/null ("").
std::string config_token(const Json& config, const char* key, const std::string& file) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  hf_fail(file,
          std::string(key) + ": expected a string or {\"content\": ...}, found " + it->dump());
}

class HfTokenizer final : public Tokenizer {
 public:
  HfTokenizer(const std::string& json_path, const std::string& config_path) {
    HfJsonFile json = read_tokenizer_json(json_path);
    const Json& rest = json.rest;
    const auto part = [&](const char* key) { return rest.contains(key) ? rest[key] : Json(); };
    normalizer_ = HfNormalizer::from_json(part("normalizer"), json_path);
    pre_tokenizer_ = HfPreTokenizer::from_json(part("pre_tokenizer"), json_path);
    const bool byte_level = pre_tokenizer_ && pre_tokenizer_->byte_level();
    const std::string model_type =
        rest.contains("model") ? json_string(rest["model"], "type", "BPE", json_path, "model")
                               : "BPE";
    if (model_type == "WordPiece") {
      model_ = std::make_unique<HfWordPieceModel>(json, json_path);
    } else {
      model_ = std::make_unique<HfBpeModel>(json, byte_level, json_path);
    }
    decoder_ = HfDecoder::from_json(part("decoder"), json_path);
    post_ = parse_post_processor(part("post_processor"), json_path);
    // (truncation and padding are ignored, as transformers ignores them unless a call asks.)

    id_to_token_ = model_->spellings();
    present_ = model_->present();
    add_tokens(part("added_tokens"), json_path);
    special_.assign(id_to_token_.size(), false);
    for (const int32_t id : special_ids_) special_[id] = true;

    uint64_t hash = json.content_hash;
    Json config;
    if (!config_path.empty()) {
      const std::string text = read_whole_file(config_path, "tokenizer config");
      hash = hf_hash(text, hash);
      try {
        config = Json::parse(text);
      } catch (const Json::exception& e) {
        hf_fail(config_path, std::string("malformed JSON: ") + e.what());
      }
      if (!config.is_object()) hf_fail(config_path, "expected a JSON object");
    }
    configure_special(config, config_path, json_path);

    std::error_code error;
    char digest[17];
    std::snprintf(digest, sizeof(digest), "%016llx", static_cast<unsigned long long>(hash));
    name_ = "tokenizer.json " + model_->kind() + " from " +
            fs::absolute(json_path, error).parent_path().string() + " [" + digest + "]";
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3);
    encode_into(text, ids);
    return ids;
  }

  std::vector<int32_t> encode(const std::string& text, bool add_special) const override {
    if (!add_special) return encode(text);
    std::vector<int32_t> ids(post_.prefix);
    encode_into(text, ids);
    ids.insert(ids.end(), post_.suffix.begin(), post_.suffix.end());
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (const int32_t id : ids) {
      if (id < 0 || id >= vocab_size() || !present_[id]) {
        throw std::out_of_range("token id " + std::to_string(id) +
                                " is outside the vocabulary of " + name_ + " (ids 0.." +
                                std::to_string(vocab_size() - 1) + ")");
      }
      tokens.push_back(id_to_token_[id]);
    }
    if (decoder_) return decoder_->decode(std::move(tokens));
    std::string text;  // no decoder: `tokenizers` joins the tokens with spaces
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
    return text;
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t eos_id() const override { return eos_; }
  int32_t bos_id() const override { return post_.prefix.empty() ? -1 : post_.prefix.front(); }
  int32_t token_id(const std::string& token) const override {
    const auto it = added_.find(token);
    return it != added_.end() ? it->second : model_->id_of(token);
  }
  bool is_special(int32_t id) const override {
    return (id >= 0 && id < vocab_size() && special_[id]) || id == eos_ || id == bos_id();
  }
  std::string name() const override { return name_; }

 private:
  void add_tokens(const Json& list, const std::string& file) {
    if (list.is_null()) return;
    if (!list.is_array()) hf_fail(file, "added_tokens: expected an array");
    for (const Json& item : list) {
      HfAddedToken token;
      const auto id = item.find("id");
      if (!item.is_object() || id == item.end() || !id->is_number_integer() ||
          id->get<int64_t>() < 0 || id->get<int64_t>() > kMaxAddedId || !item.contains("content") ||
          !item["content"].is_string()) {
        hf_fail(file, "added_tokens: expected {\"id\": 0.." + std::to_string(kMaxAddedId) +
                          ", \"content\": \"...\", ...}, found " + item.dump());
      }
      token.id = id->get<int32_t>();
      token.content = item["content"].get<std::string>();
      const std::string where = "added token '" + token.content + "'";
      token.special = json_bool(item, "special", false, file, where);
      token.lstrip = json_bool(item, "lstrip", false, file, where);
      token.rstrip = json_bool(item, "rstrip", false, file, where);
      token.single_word = json_bool(item, "single_word", false, file, where);
      // `tokenizers`' default: special tokens are not normalized, others are.
      token.normalized = json_bool(item, "normalized", !token.special, file, where);
      if (static_cast<size_t>(token.id) >= id_to_token_.size()) {
        id_to_token_.resize(token.id + 1);
        present_.resize(token.id + 1, false);
      }
      id_to_token_[token.id] = token.content;
      present_[token.id] = true;
      added_[token.content] = token.id;
      if (token.special) special_ids_.push_back(token.id);
      // A normalized token is looked for in normalized text, so its pattern is normalized too.
      if (token.normalized) {
        normalized_tokens_.add(normalizer_ ? normalizer_->normalize(token.content) : token.content,
                               token);
      } else {
        raw_tokens_.add(token.content, token);
      }
    }
  }

  // eos from tokenizer_config.json (or a well-known special token of the file), and what
  // encode(text, true) adds: transformers' LlamaTokenizerFast and GemmaTokenizerFast rebuild the
  // post-processor from add_bos_token/add_eos_token; a side the config leaves unset stays the
  // file's.
  void configure_special(const Json& config, const std::string& config_file,
                         const std::string& json_file) {
    const auto id_of = [&](const std::string& token, const char* key) {
      const int32_t id = token_id(token);
      if (id < 0) {
        hf_fail(config_file,
                std::string(key) + " '" + token + "' is not a token of '" + json_file + "'");
      }
      return id;
    };
    const std::string eos = config.is_null() ? "" : config_token(config, "eos_token", config_file);
    if (!eos.empty()) {
      eos_ = id_of(eos, "eos_token");
    } else {
      // BERT's [SEP] ends its sequences.
      for (const char* name : {"</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[SEP]"}) {
        const auto it = added_.find(name);
        if (it != added_.end() && special_[it->second]) {
          eos_ = it->second;
          break;
        }
      }
      if (eos_ < 0) {
        hf_fail(json_file,
                "no end-of-text token: " +
                    (config_file.empty() ? std::string("no tokenizer_config.json beside it")
                                         : "'" + config_file + "' sets no eos_token") +
                    ", and none of </s>, <|endoftext|>, <|end_of_text|>, <eos>, [SEP] is a "
                    "special token of the file");
      }
    }
    if (config.is_null()) return check_post_processor_ids(json_file);
    for (const bool bos : {true, false}) {
      const char* flag = bos ? "add_bos_token" : "add_eos_token";
      const char* key = bos ? "bos_token" : "eos_token";
      const auto it = config.find(flag);
      if (it == config.end() || it->is_null()) continue;
      if (!it->is_boolean()) hf_fail(config_file, std::string(flag) + ": expected true or false");
      std::vector<int32_t>& side = bos ? post_.prefix : post_.suffix;
      side.clear();
      if (!it->get<bool>()) continue;
      const std::string token = config_token(config, key, config_file);
      if (token.empty())
        hf_fail(config_file, std::string(flag) + " is true but " + key + " is not set");
      side.push_back(id_of(token, key));
    }
    check_post_processor_ids(json_file);
  }

  // The ids the post-processor (or tokenizer_config.json's add_bos/eos_token) adds must be
  // tokens of the vocabulary.
  void check_post_processor_ids(const std::string& json_file) const {
    for (const std::vector<int32_t>* side : {&post_.prefix, &post_.suffix}) {
      for (const int32_t id : *side) {
        if (id < 0 || id >= vocab_size() || !present_[id]) {
          hf_fail(json_file, "post_processor adds id " + std::to_string(id) +
                                 ", which is not in the vocabulary");
        }
      }
    }
  }

  void encode_into(const std::string& text, std::vector<int32_t>& ids) const {
    // Validity is checked once; invalid bytes then send pieces down the model's careful path.
    const bool invalid = !utf8_valid(text);
    std::vector<HfSegment> raw, normalized;
    std::deque<std::string> storage;
    auto to_model = [&](HfPiece piece) { model_->encode(piece.text, invalid, ids); };
    const HfPieceSink sink(to_model);
    split_added(raw_tokens_, text, raw);
    for (const HfSegment& segment : raw) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      std::string buffer;
      const std::string_view view =
          normalizer_ ? normalizer_->normalize(segment.text, buffer) : segment.text;
      if (view.empty()) continue;
      normalized.clear();
      split_added(normalized_tokens_, view, normalized);
      for (const HfSegment& part : normalized) {
        if (part.id >= 0) {
          ids.push_back(part.id);
          continue;
        }
        const HfPiece piece{part.text, segment.offset == 0 && part.offset == 0};
        if (!pre_tokenizer_) {
          model_->encode(piece.text, invalid, ids);
          continue;
        }
        storage.clear();
        pre_tokenizer_->split(piece, sink, storage);
      }
    }
  }

  static void split_added(const HfAddedTokenMatcher& matcher, std::string_view text,
                          std::vector<HfSegment>& out) {
    if (matcher.empty()) {
      if (!text.empty()) out.push_back({text, 0, -1});
      return;
    }
    matcher.split(text, out);
  }

  std::unique_ptr<HfNormalizer> normalizer_;
  std::unique_ptr<HfPreTokenizer> pre_tokenizer_;
  std::unique_ptr<HfModel> model_;
  std::unique_ptr<HfDecoder> decoder_;
  HfPostProcessor post_;
  HfAddedTokenMatcher raw_tokens_, normalized_tokens_;
  std::vector<std::string> id_to_token_;  // the model's spellings, added tokens' content
  std::vector<bool> present_, special_;
  std::vector<int32_t> special_ids_;
  std::unordered_map<std::string, int32_t> added_;
  int32_t eos_ = -1;
  std::string name_;
};

}  // namespace
}  // namespace detail

bool is_hf_tokenizer_path(const std::string& path) {
  std::error_code error;
  const std::filesystem::path p(path);
  if (std::filesystem::is_directory(p, error)) {
    return std::filesystem::is_regular_file(p / "tokenizer.json", error);
  }
  const std::string name = p.filename().string();
  const std::string suffix = "tokenizer.json";
  return std::filesystem::is_regular_file(p, error) && name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  std::error_code error;
  const std::filesystem::path p(path);
  const std::filesystem::path json =
      std::filesystem::is_directory(p, error) ? p / "tokenizer.json" : p;
  const std::filesystem::path config = json.parent_path() / "tokenizer_config.json";
  return std::make_unique<detail::HfTokenizer>(
      json.string(), std::filesystem::exists(config, error) ? config.string() : std::string());
}

}  // namespace shardtrain
