// Python's str operations on UTF-8 text; see jinja_unicode.h.
#include "data/jinja_unicode.h"

#include <utf8proc.h>

#include <algorithm>

#include "data/jinja_value.h"

namespace shardtrain::detail::jinja {

std::u32string utf8_decode(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t c = 0;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    static_cast<utf8proc_ssize_t>(s.size() - i), &c);
    if (n <= 0) {
      out.push_back(0xFFFD);
      ++i;
    } else {
      out.push_back(static_cast<char32_t>(c));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

void utf8_append(std::string& out, char32_t c) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string utf8_encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) utf8_append(out, c);
  return out;
}

size_t code_point_count(std::string_view s) {
  // Every byte that is not a continuation byte starts a code point.
  return static_cast<size_t>(std::count_if(
      s.begin(), s.end(), [](char ch) { return (static_cast<unsigned char>(ch) & 0xC0) != 0x80; }));
}

bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool py_isprintable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

char32_t py_upper(char32_t c) {
  return static_cast<char32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(c)));
}
char32_t py_lower(char32_t c) {
  return static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
}
char32_t py_title(char32_t c) {
  return static_cast<char32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(c)));
}
bool py_isupper_char(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT;
}
bool py_islower_char(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_LL;
}
bool py_iscased(char32_t c) { return py_isupper_char(c) || py_islower_char(c); }
bool py_isalpha(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
}
bool py_isnumeric(char32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO;
}
bool py_isdecimal(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND;
}

namespace {

// ASCII text (nearly every template string) is mapped byte by byte.
bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char ch) { return (ch & 0x80) == 0; });
}

template <typename Fn>
std::string map_chars(std::string_view s, Fn fn) {
  std::u32string cps = utf8_decode(s);
  for (char32_t& c : cps) c = fn(c);
  return utf8_encode(cps);
}

}  // namespace

std::string py_upper(std::string_view s) {
  return map_chars(s, [](char32_t c) { return py_upper(c); });
}
std::string py_lower(std::string_view s) {
  return map_chars(s, [](char32_t c) { return py_lower(c); });
}

std::string py_capitalize(std::string_view s) {
  std::u32string cps = utf8_decode(s);
  for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? py_title(cps[i]) : py_lower(cps[i]);
  return utf8_encode(cps);
}

std::string py_title(std::string_view s) {
  std::u32string cps = utf8_decode(s);
  bool previous_cased = false;
  for (char32_t& c : cps) {
    c = previous_cased ? py_lower(c) : py_title(c);
    previous_cased = py_iscased(c);
  }
  return utf8_encode(cps);
}

bool py_isupper(std::string_view s) {
  bool cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (py_islower_char(c)) return false;
    cased = cased || py_isupper_char(c);
  }
  return cased;
}

bool py_islower(std::string_view s) {
  bool cased = false;
  for (char32_t c : utf8_decode(s)) {
    if (py_isupper_char(c)) return false;
    cased = cased || py_islower_char(c);
  }
  return cased;
}

std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right) {
  const std::u32string set = chars ? utf8_decode(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) {
    return chars ? set.find(c) != std::u32string::npos : py_isspace(c);
  };
  if (is_ascii(s) && (!chars || is_ascii(*chars))) {
    size_t begin = 0, end = s.size();
    while (left && begin < end && strip_it(static_cast<unsigned char>(s[begin]))) ++begin;
    while (right && end > begin && strip_it(static_cast<unsigned char>(s[end - 1]))) --end;
    return std::string(s.substr(begin, end - begin));
  }
  const std::u32string cps = utf8_decode(s);
  size_t begin = 0, end = cps.size();
  while (left && begin < end && strip_it(cps[begin])) ++begin;
  while (right && end > begin && strip_it(cps[end - 1])) --end;
  return utf8_encode(std::u32string_view(cps).substr(begin, end - begin));
}

std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  int64_t budget = maxsplit < 0 ? INT64_MAX : maxsplit;
  if (sep) {
    if (sep->empty()) throw JinjaError("empty separator (ValueError)");
    if (!from_right) {
      size_t start = 0;
      for (size_t at; budget > 0 && (at = s.find(*sep, start)) != std::string_view::npos;
           --budget) {
        parts.emplace_back(s.substr(start, at - start));
        start = at + sep->size();
      }
      parts.emplace_back(s.substr(start));
    } else {
      size_t end = s.size();
      for (; budget > 0 && end >= sep->size(); --budget) {
        const size_t at = s.rfind(*sep, end - sep->size());
        if (at == std::string_view::npos) break;
        parts.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
        end = at;
      }
      parts.emplace_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
    return parts;
  }
  // Runs of whitespace separate; leading and trailing whitespace yields no empty parts.
  const std::u32string cps = utf8_decode(s);
  const size_t n = cps.size();
  auto piece = [&](size_t a, size_t b) {
    parts.push_back(utf8_encode(std::u32string_view(cps).substr(a, b - a)));
  };
  if (!from_right) {
    size_t i = 0;
    for (; budget > 0; --budget) {
      while (i < n && py_isspace(cps[i])) ++i;
      if (i == n) break;
      const size_t j = i;
      while (i < n && !py_isspace(cps[i])) ++i;
      piece(j, i);
    }
    while (i < n && py_isspace(cps[i])) ++i;
    if (i < n) piece(i, n);
  } else {
    size_t i = n;  // one past the character looked at
    for (; budget > 0; --budget) {
      while (i > 0 && py_isspace(cps[i - 1])) --i;
      if (i == 0) break;
      const size_t j = i;
      while (i > 0 && !py_isspace(cps[i - 1])) --i;
      piece(i, j);
    }
    while (i > 0 && py_isspace(cps[i - 1])) --i;
    if (i > 0) piece(0, i);
    std::reverse(parts.begin(), parts.end());
  }
  return parts;
}

std::vector<std::string> py_splitlines(std::string_view s) {
  const std::u32string cps = utf8_decode(s);
  std::vector<std::string> lines;
  size_t start = 0, i = 0;
  while (i < cps.size()) {
    const char32_t c = cps[i];
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                     c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++i;
      continue;
    }
    lines.push_back(utf8_encode(std::u32string_view(cps).substr(start, i - start)));
    i += (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ? 2 : 1;
    start = i;
  }
  if (start < cps.size()) lines.push_back(utf8_encode(std::u32string_view(cps).substr(start)));
  return lines;
}

std::string py_replace(std::string_view s, std::string_view old, std::string_view replacement,
                       int64_t count) {
  int64_t budget = count < 0 ? INT64_MAX : count;
  std::string out;
  if (old.empty()) {
    // Python inserts the replacement before every code point and at the end.
    const std::u32string cps = utf8_decode(s);
    for (char32_t c : cps) {
      if (budget > 0) out.append(replacement), --budget;
      utf8_append(out, c);
    }
    if (budget > 0) out.append(replacement);
    return out;
  }
  size_t start = 0;
  for (size_t at; budget > 0 && (at = s.find(old, start)) != std::string_view::npos; --budget) {
    out.append(s.substr(start, at - start)).append(replacement);
    start = at + old.size();
  }
  out.append(s.substr(start));
  return out;
}

}  // namespace shardtrain::detail::jinja
