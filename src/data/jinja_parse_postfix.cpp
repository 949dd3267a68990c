// The operand half of the expression parser: literals, names, (tuples), [lists], {dicts},
// then what follows an operand: .attribute, [subscript or slice], (call arguments), | filters and
// `is` tests. Filters and tests are checked against what the interpreter implements here.
#include <cerrno>
#include <cstdlib>

#include "data/jinja_filters.h"
#include "data/jinja_parser.h"

namespace shardtrain::detail::jinja {

ExprPtr Parser::parse_primary() {
  const Token& tok = current();
  auto node = make_expr(ExprKind::kConst, tok.line);
  if (tok.type == TokenType::kName) {
    const std::string& n = tok.value;
    if (n == "true" || n == "True") {
      node->constant = Value::boolean(true);
    } else if (n == "false" || n == "False") {
      node->constant = Value::boolean(false);
    } else if (n == "none" || n == "None") {
      node->constant = Value::none();
    } else {
      node->kind = ExprKind::kName;
      node->name = n;
      if (!macro_stack_.empty()) {
        Stmt& macro = *macro_stack_.back();
        macro.uses_varargs = macro.uses_varargs || n == "varargs";
        macro.uses_kwargs = macro.uses_kwargs || n == "kwargs";
        macro.uses_caller = macro.uses_caller || n == "caller";
      }
    }
    next();
  } else if (tok.type == TokenType::kString) {
    std::string text;
    while (current().type == TokenType::kString) text += next().value;  // 'a' 'b' == 'ab'
    node->constant = Value::str(std::move(text));
  } else if (tok.type == TokenType::kInteger) {
    std::string digits = tok.value;
    int base = 10;
    if (digits.size() > 2 && digits[0] == '0' &&
        std::string("xXoObB").find(digits[1]) != std::string::npos) {
      base = digits[1] == 'x' || digits[1] == 'X'   ? 16
             : digits[1] == 'o' || digits[1] == 'O' ? 8
                                                    : 2;
      digits = digits.substr(2);
    }
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(digits.c_str(), &end, base);
    if (errno == ERANGE) unsupported("an integer literal beyond 64 bits", tok.line);
    const bool leading_zero = base == 10 && digits.size() > 1 && digits[0] == '0' &&
                              digits.find_first_not_of('0') != std::string::npos;
    if (*end || digits.empty() || leading_zero) fail("malformed number '" + tok.value + "'");
    node->constant = Value::integer(v);
    next();
  } else if (tok.type == TokenType::kFloat) {
    node->constant = Value::real(std::strtod(tok.value.c_str(), nullptr));
    next();
  } else if (at_op("(")) {
    next();
    node = parse_tuple(true, {}, true);
    expect_op(")");
  } else if (at_op("[")) {
    next();
    node->kind = ExprKind::kList;
    while (!at_op("]")) {
      if (!node->operands.empty()) expect_op(",");
      if (at_op("]")) break;
      node->operands.push_back(parse_expression());
    }
    next();
  } else if (at_op("{")) {
    next();
    node->kind = ExprKind::kDict;
    while (!at_op("}")) {
      if (!node->operands.empty()) expect_op(",");
      if (at_op("}")) break;
      node->operands.push_back(parse_expression());
      expect_op(":");
      node->operands.push_back(parse_expression());
    }
    next();
  } else {
    fail("unexpected " + describe(tok));
  }
  return node;
}

ExprPtr Parser::parse_postfix(ExprPtr node) {
  while (true) {
    if (at_op(".") || at_op("[")) {
      node = parse_subscript(std::move(node));
    } else if (at_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_filter_expr(ExprPtr node) {
  while (true) {
    if (at_op("|")) {
      node = parse_filter(std::move(node), false);
    } else if (at_name("is")) {
      node = parse_test(std::move(node));
    } else if (at_op("(")) {
      node = parse_call(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::parse_subscript(ExprPtr node) {
  const Token op = next();
  if (op.value == ".") {
    const Token attr = next();
    if (attr.type == TokenType::kName) {
      auto e = make_expr(ExprKind::kGetattr, op.line);
      e->name = attr.value;
      e->operands.push_back(std::move(node));
      return e;
    }
    if (attr.type != TokenType::kInteger) fail("expected a name or number after '.'");
    auto e = make_expr(ExprKind::kGetitem, op.line);
    auto index = make_expr(ExprKind::kConst, op.line);
    char* end = nullptr;
    errno = 0;
    const long long position = std::strtoll(attr.value.c_str(), &end, 10);
    if (errno == ERANGE) unsupported("an integer literal beyond 64 bits", attr.line);
    if (*end) fail("malformed number '" + attr.value + "' after '.'");
    index->constant = Value::integer(position);
    e->operands.push_back(std::move(node));
    e->operands.push_back(std::move(index));
    return e;
  }
  std::vector<ExprPtr> args;
  while (!at_op("]")) {
    if (!args.empty()) expect_op(",");
    args.push_back(parse_subscribed());
  }
  next();
  if (args.size() != 1) unsupported("a tuple subscript", op.line);
  if (args[0] && args[0]->kind == ExprKind::kSlice) {  // slice: attach the object in front
    args[0]->operands[0] = std::move(node);
    return std::move(args[0]);
  }
  auto e = make_expr(ExprKind::kGetitem, op.line);
  e->operands.push_back(std::move(node));
  e->operands.push_back(std::move(args[0]));
  return e;
}

// One subscript: an expression, or a slice `start:stop:step` with any part left out.
ExprPtr Parser::parse_subscribed() {
  const int line = current().line;
  auto slice = make_expr(ExprKind::kSlice, line);
  slice->operands.push_back(nullptr);  // the object, filled in by parse_subscript
  if (skip_op(":")) {
    slice->operands.push_back(nullptr);
  } else {
    ExprPtr start = parse_expression();
    if (!skip_op(":")) return start;
    slice->operands.push_back(std::move(start));
  }
  auto bound_end = [&] { return at_op("]") || at_op(",") || at_op(":"); };
  slice->operands.push_back(bound_end() ? nullptr : parse_expression());
  if (skip_op(":")) {
    slice->operands.push_back(at_op("]") || at_op(",") ? nullptr : parse_expression());
  } else {
    slice->operands.push_back(nullptr);
  }
  return slice;
}

ExprPtr Parser::parse_call(ExprPtr callee) {
  auto call = make_expr(ExprKind::kCall, current().line);
  call->operands.push_back(std::move(callee));
  parse_call_args(*call);
  return call;
}

// `(a, b, key=value)`: positional arguments are appended to call.operands.
void Parser::parse_call_args(Expr& call) {
  expect_op("(");
  bool first = true;
  while (!at_op(")")) {
    if (!first) {
      expect_op(",");
      if (at_op(")")) break;
    }
    first = false;
    if (at_op("*") || at_op("**")) unsupported("argument unpacking with * or **", current().line);
    if (current().type == TokenType::kName && look().type == TokenType::kOperator &&
        look().value == "=") {
      std::string key = next().value;
      next();
      call.kwargs.emplace_back(std::move(key), parse_expression());
    } else {
      if (!call.kwargs.empty()) fail("a positional argument follows a keyword argument");
      call.operands.push_back(parse_expression());
    }
  }
  next();
}

ExprPtr Parser::parse_filter(ExprPtr node, bool start_inline) {
  while (at_op("|") || start_inline) {
    if (!start_inline) next();
    start_inline = false;
    const int line = current().line;
    const std::string name = expect_name();
    if (at_op(".")) unsupported("a dotted filter name", line);
    const Support support = filter_support(name);
    if (support == Support::kUnsupported) unsupported("the filter '" + name + "'", line);
    if (support == Support::kUnknown) throw JinjaError("no filter named '" + name + "'", line);
    auto filter = make_expr(ExprKind::kFilter, line);
    filter->name = name;
    filter->operands.push_back(std::move(node));
    if (at_op("(")) parse_call_args(*filter);
    node = std::move(filter);
  }
  return node;
}

ExprPtr Parser::parse_test(ExprPtr node) {
  const int line = next().line;  // `is`
  auto test = make_expr(ExprKind::kTest, line);
  test->negated = skip_name("not");
  test->name = expect_name();
  const Support support = test_support(test->name);
  if (support == Support::kUnsupported) unsupported("the test '" + test->name + "'", line);
  if (support == Support::kUnknown) throw JinjaError("no test named '" + test->name + "'", line);
  test->operands.push_back(std::move(node));
  const TokenType t = current().type;
  if (at_op("(")) {
    parse_call_args(*test);
  } else if ((t == TokenType::kName || t == TokenType::kString || t == TokenType::kInteger ||
              t == TokenType::kFloat || at_op("[") || at_op("{")) &&
             !at_name("else") && !at_name("or") && !at_name("and")) {
    // One bare argument: `x is divisibleby 3`, `x is sameas none`.
    if (at_name("is")) fail("you cannot chain tests with 'is'");
    test->operands.push_back(parse_postfix(parse_primary()));
  }
  return test;
}

}  // namespace shardtrain::detail::jinja
