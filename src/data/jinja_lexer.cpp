// Jinja's lexer with trim_blocks and lstrip_blocks; see jinja_lexer.h.
#include "data/jinja_lexer.h"

#include <algorithm>
#include <cstring>

#include "data/jinja_unicode.h"
#include "data/jinja_value.h"

namespace shardtrain::detail::jinja {
namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (c & 0x80);
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f'; }

bool only_whitespace(std::string_view s) {
  const std::u32string cps = utf8_decode(s);
  return std::all_of(cps.begin(), cps.end(), py_isspace);
}

// Python's unicode-escape decoding of a string literal's body (quotes removed): \n, \t, \\,
// \', \", \xhh, \uXXXX, \UXXXXXXXX, octal; an unknown escape keeps its backslash.
std::string decode_string(std::string_view raw, int line) {
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '\\' || i + 1 == raw.size()) {
      out += raw[i];
      continue;
    }
    const char c = raw[++i];
    switch (c) {
      case '\n':
        break;  // line continuation
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t len = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        const std::string hex(raw.substr(i + 1, len));
        if (hex.size() != len || !std::all_of(hex.begin(), hex.end(), ::isxdigit))
          throw JinjaError("truncated \\" + std::string(1, c) + " escape in a string literal",
                           line);
        utf8_append(out, static_cast<char32_t>(std::stoul(hex, nullptr, 16)));
        i += len;
        break;
      }
      case 'N':
        unsupported("the \\N{...} escape in a string literal", line);
      default:
        if (c >= '0' && c <= '7') {
          unsigned value = 0;
          size_t n = 0;
          for (; n < 3 && i < raw.size() && raw[i] >= '0' && raw[i] <= '7'; ++n, ++i)
            value = value * 8 + static_cast<unsigned>(raw[i] - '0');
          --i;
          utf8_append(out, value);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

// Longest operators first, as in Jinja's operator table.
constexpr const char* kOperators[] = {"**", "//", "==", "!=", ">=", "<=", "+", "-", "/",
                                      "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                      ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Jinja splits the source on \r\n, \r and \n and joins with \n, dropping one final newline.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      size_t open = pos_;
      while ((open = src_.find('{', open)) != std::string::npos && open + 1 < src_.size() &&
             !std::strchr("{%#", src_[open + 1]))
        ++open;
      if (open == std::string::npos || open + 1 >= src_.size()) {
        emit(TokenType::kData, src_.substr(pos_));
        break;
      }
      const char kind = src_[open + 1];
      const char mod = open + 2 < src_.size() && (src_[open + 2] == '-' || src_[open + 2] == '+')
                           ? src_[open + 2]
                           : 0;
      std::string text = src_.substr(pos_, open - pos_);
      const int newlines = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
      if (mod == '-') {
        text = py_strip(text, std::nullopt, false, true);
      } else if (mod != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag alone on its line takes its indentation away.
        const size_t line_start = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((line_start > 0 || line_starting_) && line_start < text.size() &&
            only_whitespace(std::string_view(text).substr(line_start)))
          text.resize(line_start);
      }
      if (!text.empty()) emit(TokenType::kData, text);
      line_ += newlines;
      pos_ = open + 2 + (mod ? 1 : 0);
      if (kind == '#') {
        comment();
      } else if (kind == '%' && raw_block()) {
        continue;
      } else {
        tag(kind == '%');
      }
    }
    tokens_.push_back({TokenType::kEof, "", line_});
    return std::move(tokens_);
  }

 private:
  void emit(TokenType type, std::string value) {
    tokens_.push_back({type, std::move(value), line_});
  }

  void advance_to(size_t end) {
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(pos_),
                                         src_.begin() + static_cast<std::ptrdiff_t>(end), '\n'));
    pos_ = end;
  }

  // After a tag's end marker: `-` eats all following whitespace, a plain block or comment end
  // (trim_blocks) eats one newline. Whether a line now starts decides the next lstrip.
  void after_tag_end(char mod, bool trim_newline) {
    size_t end = pos_;
    if (mod == '-') {
      while (end < src_.size()) {
        const char32_t c = utf8_decode(std::string_view(src_).substr(end, 4)).front();
        if (!py_isspace(c)) break;
        std::string enc;
        utf8_append(enc, c);
        end += enc.size();
      }
    } else if (mod != '+' && trim_newline && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    line_starting_ = end > 0 && src_[end - 1] == '\n';
    advance_to(end);
  }

  void comment() {
    const int start_line = line_;
    const size_t close = src_.find("#}", pos_);
    if (close == std::string::npos) throw JinjaError("missing end of comment tag", start_line);
    const char mod =
        close > pos_ && (src_[close - 1] == '-' || src_[close - 1] == '+') ? src_[close - 1] : 0;
    advance_to(close + 2);
    after_tag_end(mod, true);
  }

  // {% raw %}...{% endraw %}: the text between is data, tags and all.
  bool raw_block() {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3])))
      return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    const char mod = p < src_.size() && src_[p] == '-' ? '-' : 0;
    if (src_.compare(p + (mod ? 1 : 0), 2, "%}") != 0) return false;
    advance_to(p + (mod ? 3 : 2));
    after_tag_end(mod, false);
    for (size_t at = pos_; (at = src_.find("{%", at)) != std::string::npos; at += 2) {
      size_t q = at + 2;
      const char open_mod = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (open_mod) ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      const char close_mod = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (src_.compare(q + (close_mod ? 1 : 0), 2, "%}") != 0) continue;
      std::string text = src_.substr(pos_, at - pos_);
      if (open_mod == '-') text = py_strip(text, std::nullopt, false, true);
      if (!text.empty()) emit(TokenType::kData, text);
      advance_to(q + (close_mod ? 3 : 2));
      after_tag_end(close_mod, true);
      return true;
    }
    throw JinjaError("missing end of raw directive", line_);
  }

  void tag(bool block) {
    const int start_line = line_;
    emit(block ? TokenType::kBlockBegin : TokenType::kVariableBegin, block ? "{%" : "{{");
    std::string balance;  // the closing brackets owed, innermost last
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size())
        throw JinjaError(std::string("unexpected end of template inside the ") +
                             (block ? "{% ... %}" : "{{ ... }}") + " opened on line " +
                             std::to_string(start_line),
                         line_);
      if (balance.empty() && end_marker(block)) return;
      lex_one(balance);
    }
  }

  bool end_marker(bool block) {
    const char* end = block ? "%}" : "}}";
    char mod = 0;
    if ((src_[pos_] == '-' || (block && src_[pos_] == '+')) && src_.compare(pos_ + 1, 2, end) == 0)
      mod = src_[pos_];
    else if (src_.compare(pos_, 2, end) != 0)
      return false;
    emit(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, end);
    advance_to(pos_ + (mod ? 3 : 2));
    after_tag_end(mod, block);
    return true;
  }

  void lex_one(std::string& balance) {
    const char c = src_[pos_];
    size_t end = pos_;
    if (is_digit(c)) {
      // Jinja's integer and float patterns: 0x1f / 0o17 / 0b11, 1_000, 1.5, 2e10, 1.5e-3.
      auto digits = [&](size_t at, bool hex) {
        while (at < src_.size() && (is_digit(src_[at]) || src_[at] == '_' ||
                                    (hex && std::isxdigit(static_cast<unsigned char>(src_[at])))))
          ++at;
        return at;
      };
      bool is_float = false;
      if (c == '0' && pos_ + 1 < src_.size() && std::strchr("xXoObB", src_[pos_ + 1])) {
        end = digits(pos_ + 2, true);
      } else {
        end = digits(pos_, false);
        // No fraction right after a '.': `x.0.1` is items 0 and 1.
        if (end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1]) &&
            (pos_ == 0 || src_[pos_ - 1] != '.')) {
          end = digits(end + 1, false);
          is_float = true;
        }
        size_t exp = end + 1;
        if (exp < src_.size() && (src_[exp] == '+' || src_[exp] == '-')) ++exp;
        if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E') && exp < src_.size() &&
            is_digit(src_[exp])) {
          end = digits(exp, false);
          is_float = true;
        }
      }
      std::string text = src_.substr(pos_, end - pos_);
      text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
      emit(is_float ? TokenType::kFloat : TokenType::kInteger, text);
    } else if (is_name_start(c)) {
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      emit(TokenType::kName, src_.substr(pos_, end - pos_));
    } else if (c == '\'' || c == '"') {
      for (end = pos_ + 1; end < src_.size() && src_[end] != c; ++end)
        if (src_[end] == '\\') ++end;
      if (end >= src_.size()) throw JinjaError("unterminated string literal", line_);
      emit(TokenType::kString,
           decode_string(std::string_view(src_).substr(pos_ + 1, end - pos_ - 1), line_));
      ++end;
    } else {
      const char* op = nullptr;
      for (const char* candidate : kOperators)
        if (src_.compare(pos_, std::strlen(candidate), candidate) == 0) {
          op = candidate;
          break;
        }
      if (!op) throw JinjaError("unexpected character '" + std::string(1, c) + "'", line_);
      const std::string o(op);
      if (o == "(" || o == "[" || o == "{") {
        balance += o == "(" ? ')' : o == "[" ? ']' : '}';
      } else if (o == ")" || o == "]" || o == "}") {
        if (balance.empty() || balance.back() != o[0])
          throw JinjaError("unexpected '" + o + "'", line_);
        balance.pop_back();
      }
      emit(TokenType::kOperator, o);
      end = pos_ + o.size();
    }
    advance_to(end);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

std::string describe(const Token& token) {
  switch (token.type) {
    case TokenType::kEof:
      return "end of template";
    case TokenType::kBlockEnd:
      return "end of statement block";
    case TokenType::kVariableEnd:
      return "end of print statement";
    case TokenType::kData:
      return "template data";
    case TokenType::kString:
      return "string";
    default:
      return "'" + token.value + "'";
  }
}

}  // namespace shardtrain::detail::jinja
