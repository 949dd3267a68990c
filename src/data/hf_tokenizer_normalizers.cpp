// tokenizer.json normalizers (NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, BertNormalizer,
// Sequence) and the UTF-8 helpers the other parts share.
#include <utf8proc.h>

#include <cstdlib>
#include <cstring>

#include "data/hf_tokenizer.h"

namespace shardtrain::detail {

size_t utf8_length(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char c = byte(pos);
  if (c < 0x80) return 1;
  size_t length;
  uint32_t min;
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4, min = 0x10000;
  } else {
    return 0;  // a continuation byte, C0/C1 (always overlong) or F5..FF
  }
  if (pos + length > text.size()) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return 0;
  }
  const uint32_t cp = utf8_decode(text, pos, length);
  // Overlong forms, UTF-16 surrogates and code points past U+10FFFF are not UTF-8.
  if (cp < min || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
  return length;
}

uint32_t utf8_decode(std::string_view text, size_t pos, size_t length) {
  const auto byte = [&](size_t i) {
    return static_cast<uint32_t>(static_cast<unsigned char>(text[i]));
  };
  switch (length) {
    case 1:
      return byte(pos);
    case 2:
      return ((byte(pos) & 0x1F) << 6) | (byte(pos + 1) & 0x3F);
    case 3:
      return ((byte(pos) & 0x0F) << 12) | ((byte(pos + 1) & 0x3F) << 6) | (byte(pos + 2) & 0x3F);
    default:
      return ((byte(pos) & 0x07) << 18) | ((byte(pos + 1) & 0x3F) << 12) |
             ((byte(pos + 2) & 0x3F) << 6) | (byte(pos + 3) & 0x3F);
  }
}

void utf8_append(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

bool utf8_valid(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    // Eight ASCII bytes at a time: most text is mostly ASCII.
    if (i + 8 <= text.size()) {
      uint64_t word;
      std::memcpy(&word, text.data() + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const size_t length = utf8_length(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

namespace {

// utf8proc's normalization of the valid UTF-8 runs of text[begin, end); other bytes unchanged.
void normalize_runs(std::string_view text, size_t begin, size_t end, int options,
                    std::string& out) {
  for (size_t i = begin; i < end;) {
    size_t run = i;
    while (run < end) {
      const size_t length = utf8_length(text, run);
      if (length == 0) break;
      run += length;
    }
    if (run > i) {
      utf8proc_uint8_t* mapped = nullptr;
      const utf8proc_ssize_t n = utf8proc_map(
          reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
          static_cast<utf8proc_ssize_t>(run - i), &mapped, static_cast<utf8proc_option_t>(options));
      if (n < 0) throw std::runtime_error(std::string("utf8proc: ") + utf8proc_errmsg(n));
      out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
      std::free(mapped);
      i = run;
    }
    if (i < end) out += text[i++];  // a byte that is not UTF-8
  }
}

// A Unicode normalization form of `text` into `out`, or false (and `out` untouched) if it would
// be `text` unchanged. Only stretches of non-ASCII bytes can change, together with the ASCII
// character before each (a base letter composes with the marks after it): ASCII characters are
// starters that no form alters or moves. For NFC, a stretch below U+0300 (UTF-8 lead bytes below
// 0xCC) is unchanged too: nothing there decomposes or combines. Most text thus never reaches the
// library, nor gets copied.
bool unicode_normalize(std::string_view text, int options, bool nfc, std::string& out) {
  std::string result;
  size_t done = 0;
  bool changed = false;
  for (size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t end = i;
    bool above = false;
    while (end < text.size() && static_cast<unsigned char>(text[end]) >= 0x80) {
      above |= static_cast<unsigned char>(text[end]) >= 0xCC;
      ++end;
    }
    if (above || !nfc) {
      if (!changed) result.reserve(text.size() + text.size() / 8);
      changed = true;
      const size_t start = i > done ? i - 1 : i;
      result.append(text, done, start - done);
      normalize_runs(text, start, end, options, result);
      done = end;
    }
    i = end;
  }
  if (!changed) return false;
  result.append(text, done, std::string_view::npos);
  // A stretch may come out as it went in (NFC text); the caller then keeps its view.
  if (result == text) return false;
  out = std::move(result);
  return true;
}

// Rust's char::to_lowercase, which `tokenizers` applies character by character: Unicode's simple
// lowercase mapping, except U+0130 (capital I with dot above), whose full mapping is two
// characters. (No context-dependent rule, such as final sigma, is applied.)
bool lowercase(std::string_view text, std::string& out) {
  std::string result;
  result.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      result += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
      ++i;
      continue;
    }
    const size_t length = utf8_length(text, i);
    if (length == 0) {
      result += text[i++];
      continue;
    }
    const uint32_t cp = utf8_decode(text, i, length);
    if (cp == 0x130) {
      result += "i\xCC\x87";
    } else {
      utf8_append(static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))),
                  result);
    }
    i += length;
  }
  if (result == text) return false;
  out = std::move(result);
  return true;
}

// The CJK ideograph blocks around which BERT puts spaces (the `tokenizers` library's list).
bool is_cjk_ideograph(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

// BertNormalizer's clean_text and handle_chinese_chars: U+0000, U+FFFD and the "other" characters
// (general category C, but tab, newline and carriage return) dropped, whitespace made a space,
// spaces put around CJK ideographs. Bytes that are not UTF-8 stay.
bool bert_clean(std::string_view text, bool clean, bool chinese, std::string& out) {
  std::string result;
  result.reserve(text.size() + 8);
  bool changed = false;
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_length(text, i);
    if (length == 0) {
      result += text[i++];
      continue;
    }
    const uint32_t cp = utf8_decode(text, i, length);
    const std::string_view ch = text.substr(i, length);
    i += length;
    if (clean) {
      const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
      const bool other = category == UTF8PROC_CATEGORY_CC || category == UTF8PROC_CATEGORY_CF ||
                         category == UTF8PROC_CATEGORY_CS || category == UTF8PROC_CATEGORY_CO ||
                         category == UTF8PROC_CATEGORY_CN;
      if (cp == 0 || cp == 0xFFFD || (other && cp != '\t' && cp != '\n' && cp != '\r')) {
        changed = true;
        continue;
      }
      if (is_white_space(cp)) {
        changed |= cp != ' ';
        result += ' ';
        continue;
      }
    }
    if (chinese && is_cjk_ideograph(cp)) {
      changed = true;
      result += ' ';
      result.append(ch);
      result += ' ';
      continue;
    }
    result.append(ch);
  }
  if (!changed) return false;
  out = std::move(result);
  return true;
}

// BertNormalizer's strip_accents: NFD, then the nonspacing marks (Mn) dropped.
bool strip_accents(std::string_view text, std::string& out) {
  std::string decomposed;
  const bool decomposes =
      unicode_normalize(text, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, false, decomposed);
  const std::string_view source = decomposes ? std::string_view(decomposed) : text;
  std::string result;
  result.reserve(source.size());
  bool dropped = false;
  for (size_t i = 0; i < source.size();) {
    const size_t length = utf8_length(source, i);
    if (length == 0) {
      result += source[i++];
      continue;
    }
    const uint32_t cp = utf8_decode(source, i, length);
    if (utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_MN) {
      dropped = true;
    } else {
      result.append(source, i, length);
    }
    i += length;
  }
  if (!decomposes && !dropped) return false;
  out = std::move(result);
  return true;
}

}  // namespace

std::unique_ptr<HfNormalizer> HfNormalizer::from_json(const Json& json, const std::string& file) {
  if (json.is_null()) return nullptr;
  std::unique_ptr<HfNormalizer> normalizer(new HfNormalizer());
  normalizer->add(json, file);
  if (normalizer->steps_.empty()) return nullptr;
  return normalizer;
}

void HfNormalizer::add(const Json& json, const std::string& file) {
  const std::string type = json_type(json, file, "normalizer");
  if (type == "Sequence") {
    const Json& list = json.contains("normalizers") ? json["normalizers"] : Json();
    if (!list.is_array()) hf_fail(file, "normalizer Sequence: expected a 'normalizers' array");
    for (const Json& item : list) add(item, file);
  } else if (type == "NFC") {
    steps_.push_back({Kind::kNfc, "", nullptr});
  } else if (type == "NFD") {
    steps_.push_back({Kind::kNfd, "", nullptr});
  } else if (type == "NFKC") {
    steps_.push_back({Kind::kNfkc, "", nullptr});
  } else if (type == "NFKD") {
    steps_.push_back({Kind::kNfkd, "", nullptr});
  } else if (type == "Lowercase") {
    steps_.push_back({Kind::kLowercase, "", nullptr});
  } else if (type == "Prepend") {
    steps_.push_back(
        {Kind::kPrepend, json_string(json, "prepend", "", file, "normalizer Prepend"), nullptr});
  } else if (type == "Replace") {
    if (!json.contains("pattern")) hf_fail(file, "normalizer Replace has no 'pattern'");
    steps_.push_back({Kind::kReplace, json_string(json, "content", "", file, "normalizer Replace"),
                      HfPattern::from_json(json["pattern"], file, "normalizer Replace")});
  } else if (type == "BertNormalizer") {
    const std::string where = "normalizer BertNormalizer";
    Step step{Kind::kBert, "", nullptr};
    step.clean_text = json_bool(json, "clean_text", true, file, where);
    step.chinese_chars = json_bool(json, "handle_chinese_chars", true, file, where);
    step.lowercase = json_bool(json, "lowercase", true, file, where);
    // strip_accents null follows lowercase.
    step.strip_accents = json_bool(json, "strip_accents", step.lowercase, file, where);
    steps_.push_back(std::move(step));
  } else {
    hf_fail(file, "unsupported normalizer type '" + type +
                      "' (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, "
                      "BertNormalizer)");
  }
}

std::string HfNormalizer::normalize(std::string_view text) const {
  std::string buffer;
  return std::string(normalize(text, buffer));
}

std::string_view HfNormalizer::normalize(std::string_view text, std::string& buffer) const {
  std::string_view current = text;
  std::string next;
  for (const Step& step : steps_) {
    bool changed = false;
    switch (step.kind) {
      case Kind::kNfc:
        changed = unicode_normalize(current, UTF8PROC_STABLE | UTF8PROC_COMPOSE, true, next);
        break;
      case Kind::kNfd:
        changed = unicode_normalize(current, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, false, next);
        break;
      case Kind::kNfkc:
        changed = unicode_normalize(current, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                                    false, next);
        break;
      case Kind::kNfkd:
        changed = unicode_normalize(current, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
                                    false, next);
        break;
      case Kind::kLowercase:
        changed = lowercase(current, next);
        break;
      case Kind::kPrepend:
        // As `tokenizers`: an empty text stays empty.
        if (!current.empty()) {
          next = step.text;
          next += current;
          changed = true;
        }
        break;
      case Kind::kBert: {
        // The `tokenizers` library's order: clean, CJK, accents, then lowercase.
        std::string work;
        std::string_view now = current;
        if ((step.clean_text || step.chinese_chars) &&
            bert_clean(now, step.clean_text, step.chinese_chars, work)) {
          changed = true;
          now = work;
        }
        std::string stripped;
        if (step.strip_accents && strip_accents(now, stripped)) {
          changed = true;
          work = std::move(stripped);
          now = work;
        }
        std::string lowered;
        if (step.lowercase && lowercase(now, lowered)) {
          changed = true;
          work = std::move(lowered);
          now = work;
        }
        if (changed) next = std::move(work);  // `now` views `work` once anything changed
        break;
      }
      case Kind::kReplace: {
        std::string out;
        size_t last = 0;
        step.pattern->for_each_match(current, [&](size_t start, size_t end) {
          out.append(current, last, start - last);
          out += step.text;
          last = end;
          changed = true;
        });
        if (changed) {
          out.append(current, last, std::string_view::npos);
          next = std::move(out);
        }
        break;
      }
    }
    if (changed) {
      buffer.swap(next);
      current = buffer;
    }
  }
  return current;
}

}  // namespace shardtrain::detail
