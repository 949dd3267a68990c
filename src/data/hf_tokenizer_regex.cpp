#include "data/hf_tokenizer_regex.h"

#include <stdexcept>

#include "data/hf_tokenizer.h"

namespace shardtrain::detail {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

// Oniguruma's escapes (the `tokenizers` library's regex engine, Ruby syntax, UTF-8) rewritten for
// PCRE2 with UCP where the two disagree:
//   \s  Oniguruma: White_Space, which includes U+0085 (NEL); PCRE2: \p{Z} and \t\n\v\f\r only.
//   \h  Oniguruma: a hexadecimal digit; PCRE2: horizontal white space.
//   \w  Oniguruma: letters, marks, decimal digits and connector punctuation; PCRE2: \p{L}\p{N}_.
// Inside a character class the additions go into that class. Negated forms inside a class cannot
// be written without set subtraction, so \S, \H and \W there keep PCRE2's meaning (none of the
// tokenizers we know of uses them). Oniguruma's nested classes and `&&` have no PCRE2 form and
// are refused.
std::string translate_oniguruma(const std::string& pattern, const std::string& file,
                                const std::string& where) {
  static const char* const kWord = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
  std::string out;
  out.reserve(pattern.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (e == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else if (e == 'h') {
        out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
      } else if (e == 'H' && !in_class) {
        out += "[^0-9a-fA-F]";
      } else if (e == 'w') {
        out += in_class ? std::string(kWord) : "[" + std::string(kWord) + "]";
      } else if (e == 'W' && !in_class) {
        out += "[^" + std::string(kWord) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' or '^]' right after '[' is a literal ']', not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class) {
      if (c == ']') {
        in_class = false;
      } else if (c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
        const size_t close = pattern.find(":]", i + 2);  // POSIX class such as [:alpha:]
        if (close != std::string::npos) {
          out.append(pattern, i, close + 2 - i);
          i = close + 1;
          continue;
        }
      } else if (c == '[' || (c == '&' && i + 1 < pattern.size() && pattern[i + 1] == '&')) {
        hf_fail(file, where + ": regex '" + pattern +
                          "' uses a nested character class or '&&', which is not supported");
      }
    }
    out += c;
  }
  return out;
}

}  // namespace

HfPattern::~HfPattern() {
  if (code_) pcre2_code_free(code_);
}

std::shared_ptr<HfPattern> HfPattern::literal(std::string text) {
  std::shared_ptr<HfPattern> pattern(new HfPattern());
  pattern->literal_ = std::move(text);
  return pattern;
}

std::shared_ptr<HfPattern> HfPattern::regex(const std::string& pattern, const std::string& file,
                                            const std::string& where) {
  const std::string translated = translate_oniguruma(pattern, file, where);
  std::shared_ptr<HfPattern> result(new HfPattern());
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UCP makes \s, \d, \p{..} and (?i) Unicode-aware, as Oniguruma is. MATCH_INVALID_UTF lets bytes
  // that are not UTF-8 through (they match nothing) and spares the O(rest of text) validity check
  // PCRE2 would otherwise make on every call.
  result->code_ =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!result->code_) {
    hf_fail(file, where + ": regex '" + pattern + "' does not compile (as PCRE2 '" + translated +
                      "', at offset " + std::to_string(offset) + "): " + pcre2_message(error));
  }
  // JIT is several times faster; where PCRE2 was built without it the interpreter still works.
  result->jit_ = pcre2_jit_compile(result->code_, PCRE2_JIT_COMPLETE) == 0;
  return result;
}

std::shared_ptr<HfPattern> HfPattern::from_json(const nlohmann::json& json, const std::string& file,
                                                const std::string& where) {
  if (json.is_object() && json.size() == 1 && json.begin().value().is_string()) {
    const std::string& kind = json.begin().key();
    const std::string value = json.begin().value().get<std::string>();
    if (kind == "String") return literal(value);
    if (kind == "Regex") return regex(value, file, where);
  }
  hf_fail(file, where + ": expected {\"String\": ...} or {\"Regex\": ...}, found " + json.dump());
}

HfPattern::MatchData::MatchData(const pcre2_code* code)
    : data_(pcre2_match_data_create_from_pattern(code, nullptr)) {
  if (!data_) throw std::bad_alloc();
  ovector_ = pcre2_get_ovector_pointer(data_);
}

bool HfPattern::find(std::string_view text, size_t from, MatchData* data, size_t& start,
                     size_t& end) const {
  if (from > text.size()) return false;
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // pcre2_jit_match skips pcre2_match's checks of arguments we know to be right: a pattern
  // matched once per piece makes that overhead count.
  const int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), from, 0, data->data_, nullptr)
                      : pcre2_match(code_, subject, text.size(), from, 0, data->data_, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) throw std::runtime_error("tokenizer.json regex match failed: " + pcre2_message(rc));
  start = data->ovector_[0];
  end = data->ovector_[1];
  return true;
}

size_t HfPattern::next_char_length(std::string_view text, size_t pos) {
  const size_t length = utf8_length(text, pos);
  return length ? length : 1;
}

}  // namespace shardtrain::detail
