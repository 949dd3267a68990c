// The expression half of the parser (operands and what follows them are in
// jinja_parse_postfix.cpp), one function per precedence level of jinja2/parser.py:
// conditional < or < and < not < comparisons (in, not in) < + - < ~ < * / // % < ** < unary,
// with filters and `is` tests binding to the unary operand.
#include <algorithm>

#include "data/jinja_parser.h"

namespace shardtrain::detail::jinja {
namespace {

ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, int line) {
  auto e = make_expr(ExprKind::kBinary, line);
  e->name = op;
  e->operands.push_back(std::move(left));
  e->operands.push_back(std::move(right));
  return e;
}

}  // namespace

constexpr int kMaxNesting = 200;

Parser::DepthGuard::DepthGuard(Parser& parser) : parser_(parser) {
  if (++parser_.depth_ > kMaxNesting) {
    --parser_.depth_;
    parser_.fail("the template nests deeper than " + std::to_string(kMaxNesting) + " levels");
  }
}

const Token& Parser::look(size_t ahead) const {
  return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
}
Token Parser::next() {
  Token tok = tokens_[pos_];
  if (pos_ + 1 < tokens_.size()) ++pos_;
  return tok;
}
bool Parser::at_op(const char* op) const {
  return current().type == TokenType::kOperator && current().value == op;
}
bool Parser::at_name(const char* name) const {
  return current().type == TokenType::kName && current().value == name;
}
bool Parser::skip_op(const char* op) { return at_op(op) ? (next(), true) : false; }
bool Parser::skip_name(const char* name) { return at_name(name) ? (next(), true) : false; }
void Parser::expect_op(const char* op) {
  if (!skip_op(op)) fail_unexpected(("'" + std::string(op) + "'").c_str());
}
std::string Parser::expect_name() {
  if (current().type != TokenType::kName) fail_unexpected("a name");
  return next().value;
}
void Parser::fail(const std::string& message) const { throw JinjaError(message, current().line); }
void Parser::fail_unexpected(const char* expected) const {
  fail("expected " + std::string(expected) + ", got " + describe(current()));
}

bool Parser::is_tuple_end(std::initializer_list<const char*> extra_end) const {
  const TokenType t = current().type;
  if (t == TokenType::kVariableEnd || t == TokenType::kBlockEnd || at_op(")")) return true;
  return std::any_of(extra_end.begin(), extra_end.end(), [&](const char* n) { return at_name(n); });
}

ExprPtr Parser::parse_expression(bool with_condexpr) {
  return with_condexpr ? parse_condexpr() : parse_or();
}

// `a, b` is a tuple wherever Jinja reads a "tuple": {{ }}, set values, for iterables, ( ).
ExprPtr Parser::parse_tuple(bool with_condexpr, std::initializer_list<const char*> extra_end,
                            bool explicit_parentheses) {
  const int line = current().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  while (true) {
    if (!items.empty()) expect_op(",");
    if (is_tuple_end(extra_end)) break;
    items.push_back(parse_expression(with_condexpr));
    if (!at_op(",")) break;
    is_tuple = true;
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parentheses) fail_unexpected("an expression");
  }
  auto e = make_expr(ExprKind::kTuple, line);
  e->operands = std::move(items);
  return e;
}

ExprPtr Parser::parse_condexpr() {
  const int line = current().line;
  ExprPtr expr = parse_or();
  while (skip_name("if")) {
    auto cond = make_expr(ExprKind::kCondExpr, line);
    cond->operands.push_back(parse_or());
    cond->operands.push_back(std::move(expr));
    cond->operands.push_back(skip_name("else") ? parse_condexpr() : nullptr);
    expr = std::move(cond);
  }
  return expr;
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (at_name("or")) {
    const int line = next().line;
    left = binary("or", std::move(left), parse_and(), line);
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (at_name("and")) {
    const int line = next().line;
    left = binary("and", std::move(left), parse_not(), line);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (!at_name("not")) return parse_compare();
  const DepthGuard guard(*this);
  auto e = make_expr(ExprKind::kUnary, next().line);
  e->name = "not";
  e->operands.push_back(parse_not());
  return e;
}

ExprPtr Parser::parse_compare() {
  const int line = current().line;
  ExprPtr first = parse_math1();
  ExprPtr cmp;
  while (true) {
    std::string op;
    if (current().type == TokenType::kOperator &&
        (current().value == "==" || current().value == "!=" || current().value == "<" ||
         current().value == "<=" || current().value == ">" || current().value == ">=")) {
      op = next().value;
    } else if (skip_name("in")) {
      op = "in";
    } else if (at_name("not") && look().type == TokenType::kName && look().value == "in") {
      next();
      next();
      op = "notin";
    } else {
      break;
    }
    if (!cmp) {
      cmp = make_expr(ExprKind::kCompare, line);
      cmp->operands.push_back(std::move(first));
    }
    cmp->ops.push_back(op);
    cmp->operands.push_back(parse_math1());
  }
  return cmp ? std::move(cmp) : std::move(first);
}

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (at_op("+") || at_op("-")) {
    const Token op = next();
    left = binary(op.value, std::move(left), parse_concat(), op.line);
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (at_op("~")) {
    const int line = next().line;
    left = binary("~", std::move(left), parse_math2(), line);
  }
  return left;
}

ExprPtr Parser::parse_math2() {
  ExprPtr left = parse_pow();
  while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
    const Token op = next();
    left = binary(op.value, std::move(left), parse_pow(), op.line);
  }
  return left;
}

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary();
  while (at_op("**")) {  // left-associative in Jinja, unlike Python
    const int line = next().line;
    left = binary("**", std::move(left), parse_unary(), line);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
  const DepthGuard guard(*this);
  ExprPtr node;
  if (at_op("-") || at_op("+")) {
    const Token op = next();
    node = make_expr(ExprKind::kUnary, op.line);
    node->name = op.value;
    node->operands.push_back(parse_unary(false));
  } else {
    node = parse_primary();
  }
  node = parse_postfix(std::move(node));
  return with_filter ? parse_filter_expr(std::move(node)) : std::move(node);
}

}  // namespace shardtrain::detail::jinja
