#define PCRE2_CODE_UNIT_WIDTH 8

#include "shardtrain/tokenizer.h"

#include <pcre2.h>

#include <mutex>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include "data/bpe.h"

namespace shardtrain {
namespace detail {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// GPT-2's pre-tokenizer (kGpt2SplitPattern) splits text into words with their leading space,
// numbers, punctuation runs and whitespace; BPE never merges across pieces.
class Gpt2Pretokenizer {
 public:
  Gpt2Pretokenizer() {
    int error = 0;
    PCRE2_SIZE offset = 0;
    // UCP makes \s, \p{L} and \p{N} Unicode-aware, as Python's `regex` module is. MATCH_INVALID_UTF
    // lets bytes that are not UTF-8 through (they match nothing and come back as gaps), and spares
    // the O(rest of text) validity check PCRE2 would otherwise make on every one of our calls.
    code_ =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2SplitPattern), PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
    if (!code_) {
      throw std::runtime_error("GPT-2 pre-tokenizer pattern does not compile at offset " +
                               std::to_string(offset) + ": " + pcre2_message(error));
    }
    // JIT is several times faster; where PCRE2 was built without it the interpreter still works.
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
  }
  ~Gpt2Pretokenizer() { pcre2_code_free(code_); }
  Gpt2Pretokenizer(const Gpt2Pretokenizer&) = delete;
  Gpt2Pretokenizer& operator=(const Gpt2Pretokenizer&) = delete;

  // Calls `emit(piece)` for consecutive pieces that together cover `text` exactly. Bytes that are
  // not valid UTF-8 are emitted as pieces of their own so that decode(encode(x)) == x for any x.
  template <typename Emit>
  void split(std::string_view text, Emit&& emit) const {
    // Match data is per call so that concurrent encode() calls share only the compiled pattern.
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
        pcre2_match_data_create_from_pattern(code_, nullptr), &pcre2_match_data_free);
    if (!match) throw std::bad_alloc();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t offset = 0;
    while (offset < text.size()) {
      const int rc = pcre2_match(code_, subject, text.size(), offset, 0, match.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) {
        emit(text.substr(offset));
        return;
      }
      if (rc < 0) throw std::runtime_error("GPT-2 pre-tokenizer failed: " + pcre2_message(rc));
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
      if (ovector[0] > offset) emit(text.substr(offset, ovector[0] - offset));
      // Every alternative consumes at least one character, so this always advances.
      emit(text.substr(ovector[0], ovector[1] - ovector[0]));
      offset = ovector[1];
    }
  }

 private:
  pcre2_code* code_ = nullptr;
};

class Gpt2Tokenizer final : public Tokenizer {
 public:
  explicit Gpt2Tokenizer(BpeVocab vocab) : vocab_(std::move(vocab)) {}

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3);
    pretokenizer_.split(text, [&](std::string_view piece) {
      if (piece.size() <= 1 || piece.size() > kMaxCachedPiece) {
        bpe_encode_piece(vocab_, piece, ids);
        return;
      }
      // Natural text repeats a small set of words, so almost every piece is a cache hit.
      std::string key(piece);
      {
        std::lock_guard<std::mutex> lock(cache_mutex_);
        const auto it = cache_.find(key);
        if (it != cache_.end()) {
          ids.insert(ids.end(), it->second.begin(), it->second.end());
          return;
        }
      }
      const size_t first = ids.size();
      bpe_encode_piece(vocab_, piece, ids);
      std::lock_guard<std::mutex> lock(cache_mutex_);
      // Bounds memory on text with endless distinct pieces (hex dumps, base64).
      if (cache_.size() >= kMaxCacheEntries) cache_.clear();
      cache_.emplace(std::move(key), std::vector<int32_t>(ids.begin() + first, ids.end()));
    });
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    for (const int32_t id : ids) {
      if (id < 0 || id >= vocab_size() || !vocab_.id_present[id]) {
        throw std::out_of_range("token id " + std::to_string(id) +
                                " is outside the GPT-2 vocabulary (ids 0.." +
                                std::to_string(vocab_size() - 1) + ")");
      }
      text += vocab_.id_to_bytes[id];
    }
    return text;
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.id_to_bytes.size()); }
  int32_t eos_id() const override { return vocab_.eos_id; }
  std::string name() const override { return "gpt2"; }

 private:
  static constexpr size_t kMaxCachedPiece = 64;
  static constexpr size_t kMaxCacheEntries = size_t{1} << 20;

  const BpeVocab vocab_;
  const Gpt2Pretokenizer pretokenizer_;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (const int32_t id : ids) {
      if (id == kEos) {
        text += "<|endoftext|>";  // as GPT-2 decodes its end-of-text id
      } else if (id >= 0 && id < kEos) {
        text += static_cast<char>(id);
      } else {
        throw std::out_of_range("token id " + std::to_string(id) +
                                " is outside the byte vocabulary (ids 0..256)");
      }
    }
    return text;
  }

  int64_t vocab_size() const override { return 257; }
  int32_t eos_id() const override { return kEos; }
  std::string name() const override { return "byte"; }

 private:
  static constexpr int32_t kEos = 256;
};

}  // namespace
}  // namespace detail

std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& encoder_json,
                                               const std::string& vocab_bpe) {
  return std::make_unique<detail::Gpt2Tokenizer>(detail::load_gpt2_vocab(encoder_json, vocab_bpe));
}

std::unique_ptr<Tokenizer> make_byte_tokenizer() {
  return std::make_unique<detail::ByteTokenizer>();
}

}  // namespace shardtrain
