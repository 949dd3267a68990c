// Patterns of tokenizer.json ({"String": ...} or {"Regex": ...}) used by Split, Replace and the
// ByteLevel pre-tokenizer. Hugging Face's `tokenizers` runs regexes with Oniguruma; these run
// with PCRE2 (JIT) after a translation of the few escapes whose meaning differs (see the .cpp).
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8

#include <pcre2.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace shardtrain::detail {

class HfPattern {
 public:
  // A literal string: matched byte for byte, as `tokenizers` matches regex::escape(string).
  static std::shared_ptr<HfPattern> literal(std::string text);
  // An Oniguruma regular expression. Throws std::invalid_argument naming `file` and `where` if it
  // does not compile or uses what the translation does not handle.
  static std::shared_ptr<HfPattern> regex(const std::string& pattern, const std::string& file,
                                          const std::string& where);
  // From {"String": "..."} or {"Regex": "..."}.
  static std::shared_ptr<HfPattern> from_json(const nlohmann::json& json, const std::string& file,
                                              const std::string& where);

  ~HfPattern();
  HfPattern(const HfPattern&) = delete;
  HfPattern& operator=(const HfPattern&) = delete;

  // Calls match(start, end) for each match in `text`, left to right and non-overlapping, empty
  // matches included except one right where the previous match ended (the Rust `regex` and
  // `onig` crates' find_iter rule). Bytes that are not UTF-8 never belong to a regex match.
  template <typename Match>
  void for_each_match(std::string_view text, Match&& match) const {
    if (!code_) {
      if (literal_.empty()) return;
      for (size_t at = text.find(literal_); at != std::string_view::npos;
           at = text.find(literal_, at + literal_.size())) {
        match(at, at + literal_.size());
      }
      return;
    }
    MatchData data(code_);
    size_t from = 0, last_end = std::string_view::npos;
    while (from <= text.size()) {
      size_t start, end;
      if (!find(text, from, data.get(), start, end)) return;
      if (start == end && start == last_end) {
        // An empty match where the last one ended: look again one character further.
        if (start >= text.size()) return;
        from = start + next_char_length(text, start);
        if (!find(text, from, data.get(), start, end)) return;
      }
      match(start, end);
      last_end = end;
      from = end > start ? end : end + (end < text.size() ? next_char_length(text, end) : 1);
    }
  }

 private:
  HfPattern() = default;
  // Match data is per call so that concurrent encode() calls share only the compiled pattern.
  class MatchData {
   public:
    explicit MatchData(const pcre2_code* code);
    ~MatchData() { pcre2_match_data_free(data_); }
    MatchData* get() { return this; }
    pcre2_match_data* data_;
    const PCRE2_SIZE* ovector_;
  };
  bool find(std::string_view text, size_t from, MatchData* data, size_t& start, size_t& end) const;
  static size_t next_char_length(std::string_view text, size_t pos);

  std::string literal_;
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace shardtrain::detail
