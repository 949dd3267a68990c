// Python's str semantics over UTF-8 std::string: lengths, indexes and slices count code points
// (a template's `content[:10]` or `|length` must not cut an emoji in half), and whitespace, case
// and printability follow Python's Unicode tables (through utf8proc) rather than the C locale.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace shardtrain::detail::jinja {

std::u32string utf8_decode(std::string_view s);  // invalid bytes become U+FFFD
std::string utf8_encode(std::u32string_view s);
void utf8_append(std::string& out, char32_t c);
size_t code_point_count(std::string_view s);

// str.isspace() of one character: Python's set, wider than C's (U+0085, U+00A0, U+2028...).
bool py_isspace(char32_t c);
// str.isprintable() of one character: what repr() leaves unescaped.
bool py_isprintable(char32_t c);
char32_t py_upper(char32_t c);  // simple case mappings (Python's full ones differ for a
char32_t py_lower(char32_t c);  // handful of letters such as 'ß'.upper() == 'SS')
char32_t py_title(char32_t c);
bool py_iscased(char32_t c);
bool py_isalpha(char32_t c);    // a letter (category L*)
bool py_isnumeric(char32_t c);  // a number (category N*); isdigit() takes decimal digits (Nd)
bool py_isdecimal(char32_t c);
bool py_isupper_char(char32_t c);
bool py_islower_char(char32_t c);

std::string py_upper(std::string_view s);
std::string py_lower(std::string_view s);
std::string py_capitalize(std::string_view s);  // str.capitalize()
std::string py_title(std::string_view s);       // str.title()
bool py_isupper(std::string_view s);            // str.isupper(): has cased, none lower
bool py_islower(std::string_view s);

// str.strip/lstrip/rstrip: whitespace, or the characters of `chars` when given.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
// str.split / str.rsplit: on runs of whitespace without `sep`; maxsplit < 0 means no limit.
std::vector<std::string> py_split(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit, bool from_right = false);
// str.splitlines() (without keepends): \n, \r\n, \r, \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029.
std::vector<std::string> py_splitlines(std::string_view s);
// str.replace; count < 0 replaces all. An empty `old` inserts between code points, as Python.
std::string py_replace(std::string_view s, std::string_view old, std::string_view replacement,
                       int64_t count);

}  // namespace shardtrain::detail::jinja
