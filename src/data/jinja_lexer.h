// Tokens of a Jinja template, cut as Jinja's own lexer cuts them with transformers' settings:
// trim_blocks (the newline after a block or comment tag goes), lstrip_blocks (spaces and tabs
// before a block or comment tag on its own line go), `-` and `+` whitespace control, one trailing
// newline of the template dropped, and \r\n and \r read as \n. Comments leave no token; a
// {% raw %} block becomes text.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace shardtrain::detail::jinja {

enum class TokenType {
  kData,           // template text outside tags
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,   // value: the decoded text
  kInteger,  // value: the digits, underscores removed (base prefix kept)
  kFloat,
  kOperator,  // value: "(", "==", "|", ...
  kEof,
};

struct Token {
  TokenType type;
  std::string value;
  int line;
};

// Throws JinjaError (with the line) for an unterminated tag, comment or string, or a character
// that cannot start a token.
std::vector<Token> tokenize(std::string_view source);

// How a token reads in an error message: "'endfor'", "end of statement block", "end of template".
std::string describe(const Token& token);

}  // namespace shardtrain::detail::jinja
