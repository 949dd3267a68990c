// Reading tokenizer.json. A large model's file is tens of megabytes (Gemma 3: 33 MB, 262k tokens,
// 515k merges), nearly all of it model.vocab and model.merges; building those as a JSON tree and
// then copying them out would take seconds. A SAX handler reads them straight into vectors and
// builds an ordinary tree for the small rest.
#include <algorithm>

#include "data/hf_tokenizer.h"

namespace shardtrain::detail {

void hf_fail(const std::string& file, const std::string& problem) {
  throw std::invalid_argument("tokenizer file '" + file + "': " + problem);
}

std::string json_type(const Json& object, const std::string& file, const std::string& where) {
  if (!object.is_object() || !object.contains("type") || !object["type"].is_string()) {
    hf_fail(file,
            where + ": expected an object with a \"type\", found " + object.dump().substr(0, 200));
  }
  return object["type"].get<std::string>();
}

std::string json_string(const Json& object, const char* key, const std::string& fallback,
                        const std::string& file, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_string()) {
    hf_fail(file, where + "." + key + ": expected a string, found " + it->dump());
  }
  return it->get<std::string>();
}

bool json_bool(const Json& object, const char* key, bool fallback, const std::string& file,
               const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    hf_fail(file, where + "." + key + ": expected true or false, found " + it->dump());
  }
  return it->get<bool>();
}

namespace {

class TokenizerJsonSax : public nlohmann::json_sax<Json> {
 public:
  TokenizerJsonSax(HfJsonFile& out, const std::string& file) : out_(out), file_(file) {}

  bool null() override { return value(Json()); }
  bool boolean(bool v) override { return value(Json(v)); }
  bool number_integer(number_integer_t v) override { return number(v, Json(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    return number(static_cast<int64_t>(std::min<uint64_t>(v, INT64_MAX)), Json(v));
  }
  bool number_float(number_float_t v, const string_t&) override {
    if (capture_ != Capture::kNone) fail_capture("a number that is not an integer");
    return value(Json(v));
  }
  bool binary(binary_t&) override { return value(Json()); }
  bool string(string_t& v) override {
    if (capture_ == Capture::kMerges && depth_ == 1) {
      // "a b": the format before tokenizers 0.20, which cannot hold a token with a space.
      const size_t space = v.find(' ');
      if (space == std::string::npos || v.find(' ', space + 1) != std::string::npos) {
        hf_fail(file_, "model.merges[" + std::to_string(out_.merges.size()) +
                           "]: expected two tokens separated by one space, found '" + v + "'");
      }
      out_.merges.emplace_back(v.substr(0, space), v.substr(space + 1));
      return true;
    }
    if (capture_ == Capture::kMerges && depth_ == 2) {
      pair_.push_back(std::move(v));
      return true;
    }
    if (capture_ != Capture::kNone) fail_capture("a string");
    return value(Json(std::move(v)));
  }
  bool start_object(std::size_t) override {
    if (capture_ == Capture::kVocab && depth_ == 0) return ++depth_, true;
    if (capture_ != Capture::kNone) fail_capture("an object");
    Json* j = place(Json::object());
    stack_.push_back(j);
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (capture_ == Capture::kVocab) {
      token_ = std::move(k);
      return true;
    }
    // model.vocab and model.merges go to the vectors, not into the tree.
    // (Only for BPE: another model's vocab, such as Unigram's list, stays in the tree so that
    // the model type is what gets reported.)
    if (stack_.size() == 2 && keys_[0] == "model" && (k == "vocab" || k == "merges") &&
        is_bpe_so_far(*stack_.back())) {
      capture_ = k == "vocab" ? Capture::kVocab : Capture::kMerges;
      (capture_ == Capture::kVocab ? out_.has_vocab : out_.has_merges) = true;
      depth_ = 0;
      return true;
    }
    keys_.back() = k;
    slot_ = &(*stack_.back())[k];
    return true;
  }
  bool end_object() override {
    if (capture_ == Capture::kVocab) return capture_ = Capture::kNone, true;
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    if (capture_ == Capture::kMerges && depth_ < 2) {
      if (++depth_ == 2) pair_.clear();
      return true;
    }
    if (capture_ != Capture::kNone) fail_capture("an array");
    Json* j = place(Json::array());
    stack_.push_back(j);
    keys_.emplace_back();
    return true;
  }
  bool end_array() override {
    if (capture_ == Capture::kMerges) {
      if (depth_-- == 1) return capture_ = Capture::kNone, true;
      if (pair_.size() != 2) {
        hf_fail(file_, "model.merges[" + std::to_string(out_.merges.size()) +
                           "]: expected a pair of tokens, found " + std::to_string(pair_.size()) +
                           " strings");
      }
      out_.merges.emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      return true;
    }
    stack_.pop_back();
    keys_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    message_ = e.what();
    return false;
  }

  const std::string& message() const { return message_; }

 private:
  enum class Capture { kNone, kVocab, kMerges };

  static bool is_bpe_so_far(const Json& model) {
    const auto type = model.find("type");
    return type == model.end() || (type->is_string() && type->get<std::string>() == "BPE");
  }

  bool number(int64_t v, Json j) {
    if (capture_ == Capture::kVocab) {
      if (v < 0) hf_fail(file_, "model.vocab: token '" + token_ + "' has a negative id");
      out_.vocab.emplace_back(std::move(token_), v);
      return true;
    }
    if (capture_ != Capture::kNone) fail_capture("a number");
    return value(std::move(j));
  }
  bool value(Json j) {
    if (capture_ != Capture::kNone) fail_capture(j.type_name());
    place(std::move(j));
    return true;
  }
  [[noreturn]] void fail_capture(const std::string& found) {
    if (capture_ == Capture::kVocab) {
      hf_fail(file_, "model.vocab: expected an object mapping tokens to integer ids, found " +
                         found + (token_.empty() ? "" : " for token '" + token_ + "'"));
    }
    hf_fail(file_, "model.merges: expected strings \"a b\" or pairs [\"a\", \"b\"], found " +
                       found + " at merge " + std::to_string(out_.merges.size()));
  }
  Json* place(Json j) {
    if (stack_.empty()) {
      out_.rest = std::move(j);
      return &out_.rest;
    }
    Json* top = stack_.back();
    if (top->is_array()) {
      top->push_back(std::move(j));
      return &top->back();
    }
    *slot_ = std::move(j);
    return slot_;
  }

  HfJsonFile& out_;
  const std::string& file_;
  std::vector<Json*> stack_;
  std::vector<std::string> keys_;  // the current key of each open object
  Json* slot_ = nullptr;
  Capture capture_ = Capture::kNone;
  int depth_ = 0;
  std::string token_;
  std::vector<std::string> pair_;
  std::string message_;
};

}  // namespace

uint64_t hf_hash(std::string_view bytes, uint64_t seed) {
  uint64_t hash = seed;
  for (const char c : bytes) hash = (hash ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return hash;
}

HfJsonFile read_tokenizer_json(const std::string& path) {
  const std::string text = read_whole_file(path, "tokenizer file");
  HfJsonFile out;
  out.content_hash = hf_hash(text);
  TokenizerJsonSax sax(out, path);
  // (nlohmann's message gives the line and column.)
  if (!Json::sax_parse(text, &sax)) hf_fail(path, "malformed JSON: " + sax.message());
  if (!out.rest.is_object()) hf_fail(path, "expected a JSON object at the top level");
  return out;
}

}  // namespace shardtrain::detail
