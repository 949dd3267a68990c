// The parts of a Hugging Face tokenizer.json tokenizer, each built from its JSON object and
// applied in the `tokenizers` library's order: added tokens are split out of the raw text, the
// rest is normalized, pre-tokenized into pieces, and each piece goes through the model (BPE or
// WordPiece); the
// post-processor adds what encode(text, true) adds, and decoding runs the decoder chain.
//
// Every parser throws std::invalid_argument through hf_fail(), naming the file and the problem.
// Text is handled as bytes throughout; where a step needs characters, bytes that are not valid
// UTF-8 pass through unchanged (hf_tokenizer.cpp says what the model makes of them).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/bpe.h"
#include "data/hf_tokenizer_regex.h"

namespace shardtrain::detail {

using Json = nlohmann::json;

// Throws std::invalid_argument("tokenizer file '<file>': <problem>").
[[noreturn]] void hf_fail(const std::string& file, const std::string& problem);
// `object[key]` as a string or a bool, or `fallback` when absent or null; another type fails
// naming `where` and the key (e.g. "model.unk_token").
std::string json_string(const Json& object, const char* key, const std::string& fallback,
                        const std::string& file, const std::string& where);
bool json_bool(const Json& object, const char* key, bool fallback, const std::string& file,
               const std::string& where);
// "type" of a component object, failing if it has none.
std::string json_type(const Json& object, const std::string& file, const std::string& where);

// UTF-8 helpers. utf8_length() is the length of the character starting at text[pos] (1..4), or 0
// if the bytes there are not a valid UTF-8 character.
size_t utf8_length(std::string_view text, size_t pos);
uint32_t utf8_decode(std::string_view text, size_t pos, size_t length);
void utf8_append(uint32_t code_point, std::string& out);
bool utf8_valid(std::string_view text);
// Unicode's White_Space: Rust's char::is_whitespace and the `regex` crate's \s, which lstrip,
// rstrip, BertNormalizer and BertPreTokenizer use.
bool is_white_space(uint32_t cp);

// One piece of text on its way to the model. `at_start`: it begins at offset 0 of the text passed
// to encode(), which Metaspace's prepend_scheme "first" asks about.
struct HfPiece {
  std::string_view text;
  bool at_start;
};

// ---- tokenizer.json read in one pass (hf_tokenizer_json.cpp) ----
// model.vocab and model.merges, which are nine tenths of a large file, are read straight into
// these vectors; everything else becomes `rest`, whose "model" lacks those two keys.
struct HfJsonFile {
  Json rest;
  uint64_t content_hash = 0;  // hf_hash() of the file's bytes
  std::vector<std::pair<std::string, int64_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  bool has_vocab = false, has_merges = false;
};
HfJsonFile read_tokenizer_json(const std::string& path);
// 64-bit FNV-1a: identifies a file's content in name().
uint64_t hf_hash(std::string_view bytes, uint64_t seed = 0xcbf29ce484222325ull);

// ---- normalizers (hf_tokenizer_normalizers.cpp) ----
class HfNormalizer {
 public:
  // nullptr for a null normalizer or an empty Sequence.
  static std::unique_ptr<HfNormalizer> from_json(const Json& json, const std::string& file);
  // The normalized text; Sequence steps are applied in order. The view is `text` itself where no
  // step changed it, else `buffer`: most text is already in normal form and is not copied.
  std::string_view normalize(std::string_view text, std::string& buffer) const;
  std::string normalize(std::string_view text) const;

 private:
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kPrepend, kReplace, kBert };
  struct Step {
    Kind kind;
    std::string text;                    // Prepend's prefix, Replace's content
    std::shared_ptr<HfPattern> pattern;  // Replace's
    // BertNormalizer's switches: drop control characters and make whitespace a space, put
    // spaces around CJK ideographs, strip accents (NFD, then no nonspacing marks), lowercase.
    bool clean_text = true, chinese_chars = true, strip_accents = true, lowercase = true;
  };
  void add(const Json& json, const std::string& file);
  std::vector<Step> steps_;
};

// Where pieces go: a reference to a callable, cheaper than std::function (no allocation). It must
// not outlive the callable.
class HfPieceSink {
 public:
  template <typename F>
  explicit HfPieceSink(F& f)
      : object_(&f), call_([](void* o, HfPiece piece) { (*static_cast<F*>(o))(piece); }) {}
  void operator()(HfPiece piece) const { call_(object_, piece); }

 private:
  void* object_;
  void (*call_)(void*, HfPiece);
};

// ---- pre-tokenizers (hf_tokenizer_pretokenizers.cpp) ----
enum class HfSplitBehavior {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous
};

class HfPreTokenizer {
 public:
  // nullptr for null or an empty Sequence.
  static std::unique_ptr<HfPreTokenizer> from_json(const Json& json, const std::string& file);
  // Whether the last step is ByteLevel: the model then sees each piece's bytes as its symbols.
  bool byte_level() const { return byte_level_; }
  // Passes the pre-tokens of `piece` to `sink`, in order. Steps that rewrite text (Metaspace,
  // ByteLevel's prefix space) keep the new text in `storage` (a deque: its strings never move).
  void split(HfPiece piece, const HfPieceSink& sink, std::deque<std::string>& storage) const;

 private:
  // kBert: BertPreTokenizer, split at whitespace (removed) and punctuation (each mark alone).
  enum class Kind { kSplit, kByteLevel, kMetaspace, kDigits, kBert };
  struct Step {
    Kind kind;
    std::shared_ptr<HfPattern> pattern;  // Split's, or ByteLevel's GPT-2 pattern with use_regex
    HfSplitBehavior behavior = HfSplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // ByteLevel
    std::string replacement;        // Metaspace
    enum { kAlways, kFirst, kNever } prepend = kAlways;
    bool split = true;               // Metaspace
    bool individual_digits = false;  // Digits
  };
  void add(const Json& json, const std::string& file);
  void apply(size_t index, HfPiece piece, const HfPieceSink& sink,
             std::deque<std::string>& storage) const;
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

// ---- the models: BPE (hf_tokenizer_model.cpp), WordPiece (hf_tokenizer_wordpiece.cpp) ----
class HfModel {
 public:
  virtual ~HfModel() = default;
  // Appends the ids of one pre-token. `maybe_invalid`: the text had bytes that are not UTF-8.
  virtual void encode(std::string_view piece, bool maybe_invalid,
                      std::vector<int32_t>& out) const = 0;
  // The vocabulary as spelled in the file, by id ("" where an id is unused).
  virtual const std::vector<std::string>& spellings() const = 0;
  virtual const std::vector<bool>& present() const = 0;       // ids the vocab uses
  virtual int32_t id_of(std::string_view spelled) const = 0;  // -1 if not in the vocabulary
  // What the tokenizer's name says of the model: "BPE (byte-level)", "WordPiece", ...
  virtual std::string kind() const = 0;
};

class HfTokenTable;
class HfPieceCache;

class HfBpeModel final : public HfModel {
 public:
  // Builds the model from the file's vocab, merges and model options. `byte_level`: pieces arrive
  // as raw bytes (ByteLevel pre-tokenizer), so tokens are matched by the bytes they stand for.
  // Takes (empties) the vocab and merges of `file_json`.
  HfBpeModel(HfJsonFile& file_json, bool byte_level, const std::string& file);
  ~HfBpeModel() override;
  void encode(std::string_view piece, bool maybe_invalid, std::vector<int32_t>& out) const override;
  const std::vector<std::string>& spellings() const override { return id_to_spelled_; }
  const std::vector<bool>& present() const override { return id_present_; }
  int32_t id_of(std::string_view spelled) const override;
  std::string kind() const override;
  bool byte_level() const { return byte_level_; }
  bool byte_fallback() const { return byte_fallback_; }

 private:
  void encode_valid(std::string_view piece, std::vector<int32_t>& out) const;
  void initial_symbols(std::string_view piece, std::vector<int32_t>& out) const;
  int32_t char_id(uint32_t code_point) const;

  std::vector<std::string> id_to_spelled_;
  std::vector<bool> id_present_;
  std::unordered_map<std::string_view, int32_t> spelled_to_id_;  // views into id_to_spelled_
  // ignore_merges looks a whole piece up by what the model sees (bytes when byte-level).
  std::unique_ptr<HfTokenTable> whole_pieces_;
  MergeTable merges_;
  bool byte_level_ = false, byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  int32_t unk_id_ = -1;
  std::array<int32_t, 256> byte_to_id_{};  // byte-level symbols, or <0xNN> with byte_fallback
  std::vector<int32_t> bmp_char_to_id_;    // code point < 0x10000 -> id of that one character
  std::unordered_map<uint32_t, int32_t> astral_char_to_id_;
  std::unique_ptr<HfPieceCache> cache_;
};

// BERT's WordPiece: greedy longest-match-first pieces, "##" before those inside a word.
class HfWordPieceModel final : public HfModel {
 public:
  // From the file's model object (its vocab, unk_token, continuing_subword_prefix,
  // max_input_chars_per_word).
  HfWordPieceModel(const HfJsonFile& file_json, const std::string& file);
  void encode(std::string_view piece, bool maybe_invalid, std::vector<int32_t>& out) const override;
  const std::vector<std::string>& spellings() const override { return id_to_spelled_; }
  const std::vector<bool>& present() const override { return id_present_; }
  int32_t id_of(std::string_view spelled) const override;
  std::string kind() const override { return "WordPiece"; }

 private:
  std::vector<std::string> id_to_spelled_;
  std::vector<bool> id_present_;
  std::unordered_map<std::string_view, int32_t> spelled_to_id_;  // views into id_to_spelled_
  std::string prefix_ = "##";
  size_t max_chars_ = 100;
  int32_t unk_id_ = -1;
};

// ---- added tokens (hf_tokenizer_added.cpp) ----
struct HfAddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

// A text split at the added tokens found in it: each segment is plain text (id -1) or a token.
struct HfSegment {
  std::string_view text;
  size_t offset;
  int32_t id;
};

// Finds one set of added tokens in text, leftmost first and longest at a position, as the
// `tokenizers` library's Aho-Corasick (MatchKind::LeftmostLongest) does.
class HfAddedTokenMatcher {
 public:
  void add(std::string pattern, const HfAddedToken& token);
  bool empty() const { return tokens_.empty(); }
  void split(std::string_view text, std::vector<HfSegment>& out) const;

 private:
  int32_t child(int32_t node, unsigned char byte) const;
  std::vector<HfAddedToken> tokens_;
  std::vector<int32_t> node_token_;  // trie node -> index into tokens_ ending there, or -1
  std::unordered_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
  std::array<bool, 256> first_byte_{};
};

// ---- decoders and post-processors (hf_tokenizer_decoders.cpp) ----
class HfDecoder {
 public:
  // nullptr for null: tokens are then joined with spaces, as `tokenizers` does.
  static std::unique_ptr<HfDecoder> from_json(const Json& json, const std::string& file);
  std::string decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace, kWordPiece };
  struct Step {
    Kind kind;
    std::shared_ptr<HfPattern> pattern;  // Replace
    // Replace's content, Strip's character, Metaspace's replacement, WordPiece's prefix
    std::string content;
    size_t start = 0, stop = 0;          // Strip
    bool strip_first = true;             // Metaspace: prepend_scheme is not "never"
    bool cleanup = true;                 // WordPiece: join punctuation and contractions
  };
  void add(const Json& json, const std::string& file);
  std::vector<Step> steps_;
};

// What encode(text, true) puts around the ids: TemplateProcessing's single template (Sequence
// folds several), RobertaProcessing's and BertProcessing's cls/sep; ByteLevel adds nothing.
struct HfPostProcessor {
  std::vector<int32_t> prefix, suffix;
};
HfPostProcessor parse_post_processor(const Json& json, const std::string& file);

}  // namespace shardtrain::detail
