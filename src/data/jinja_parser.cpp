// The statement half of the parser: template text, {{ }} and the {% %} tags.
#include "data/jinja_parser.h"

#include <algorithm>

namespace shardtrain::detail::jinja {

Program parse(std::string_view source) { return Parser(tokenize(source)).parse_program(); }

Program Parser::parse_program() {
  Program program;
  program.body = parse_body({}, nullptr, 0);
  return program;
}

// Reads statements up to a {% tag %} named in `end_tags` (or the end of the template when there
// are none), leaving the token stream on that tag's name.
Body Parser::parse_body(std::initializer_list<const char*> end_tags, const char* opener, int line,
                        std::string* found_end) {
  Body body;
  while (true) {
    const Token& tok = current();
    if (tok.type == TokenType::kData) {
      auto stmt = std::make_unique<Stmt>();
      stmt->kind = StmtKind::kText;
      stmt->line = tok.line;
      stmt->text = next().value;
      body.push_back(std::move(stmt));
    } else if (tok.type == TokenType::kVariableBegin) {
      auto stmt = std::make_unique<Stmt>();
      stmt->kind = StmtKind::kOutput;
      stmt->line = next().line;
      stmt->expr = parse_tuple(true);
      if (current().type != TokenType::kVariableEnd) fail_unexpected("end of print statement");
      next();
      body.push_back(std::move(stmt));
    } else if (tok.type == TokenType::kBlockBegin) {
      const Token& name = look();
      if (name.type == TokenType::kName &&
          std::any_of(end_tags.begin(), end_tags.end(),
                      [&](const char* t) { return name.value == t; })) {
        next();
        if (found_end) *found_end = name.value;
        return body;
      }
      next();
      body.push_back(parse_statement());
    } else if (tok.type == TokenType::kEof) {
      if (end_tags.size() == 0) return body;
      std::string expected;
      for (const char* t : end_tags) expected += std::string(expected.empty() ? "" : " or ") + t;
      fail("unexpected end of template: {% " + std::string(opener) + " %} on line " +
           std::to_string(line) + " is not closed (expected {% " + expected + " %})");
    } else {
      fail_unexpected("template data");
    }
  }
}

StmtPtr Parser::parse_statement() {
  const DepthGuard guard(*this);
  const int line = current().line;
  if (current().type != TokenType::kName) fail_unexpected("a statement name");
  const std::string tag = next().value;
  if (tag == "if") return parse_if(line);
  if (tag == "for") return parse_for(line);
  if (tag == "set") return parse_set(line);
  if (tag == "macro") return parse_macro(line);
  if (tag == "call") return parse_call_block(line);
  if (tag == "filter") return parse_filter_block(line);
  if (tag == "with") return parse_with(line);
  auto stmt = std::make_unique<Stmt>();
  stmt->line = line;
  if (tag == "print") {
    stmt->kind = StmtKind::kOutput;
    stmt->expr = parse_tuple(true);
    end_statement("print");
    return stmt;
  }
  if (tag == "break" || tag == "continue") {
    if (loop_depth_ == 0) fail("{% " + tag + " %} outside of a loop");
    stmt->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    end_statement(tag.c_str());
    return stmt;
  }
  if (tag == "generation") {
    // transformers' AssistantTracker tag: it only marks the assistant's tokens for a mask.
    stmt->kind = StmtKind::kScope;
    end_statement("generation");
    stmt->body = parse_body({"endgeneration"}, "generation", line);
    end_statement("endgeneration");
    return stmt;
  }
  static const char* const kRefused[] = {"include",    "import", "from",  "extends",   "block",
                                         "autoescape", "do",     "trans", "pluralize", "debug"};
  if (std::find(std::begin(kRefused), std::end(kRefused), tag) != std::end(kRefused))
    unsupported("the {% " + tag + " %} statement", line);
  if (tag.rfind("end", 0) == 0 || tag == "elif" || tag == "else")
    fail("unexpected {% " + tag + " %} (no open block it closes)");
  fail("unknown tag '" + tag + "'");
}

void Parser::end_statement(const char* tag) {
  if (current().type != TokenType::kBlockEnd)
    fail_unexpected(("end of {% " + std::string(tag) + " %} statement").c_str());
  next();
}

StmtPtr Parser::parse_if(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kIf;
  stmt->line = line;
  while (true) {
    ExprPtr test = parse_tuple(false);
    end_statement("if");
    std::string end;
    Body body = parse_body({"elif", "else", "endif"}, "if", line, &end);
    stmt->branches.emplace_back(std::move(test), std::move(body));
    next();  // the end tag's name
    if (end == "elif") continue;
    if (end == "else") {
      end_statement("else");
      stmt->else_body = parse_body({"endif"}, "if", line);
      next();
    }
    end_statement("endif");
    return stmt;
  }
}

StmtPtr Parser::parse_for(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kFor;
  stmt->line = line;
  parse_assign_target(*stmt, {"in"}, false);
  if (!skip_name("in")) fail_unexpected("'in'");
  stmt->expr = parse_tuple(false, {"recursive"});
  if (skip_name("if")) stmt->condition = parse_expression();
  if (at_name("recursive")) unsupported("a recursive for loop", current().line);
  end_statement("for");
  ++loop_depth_;
  std::string end;
  stmt->body = parse_body({"endfor", "else"}, "for", line, &end);
  --loop_depth_;
  next();
  if (end == "else") {
    end_statement("else");
    stmt->else_body = parse_body({"endfor"}, "for", line);
    next();
  }
  end_statement("endfor");
  return stmt;
}

StmtPtr Parser::parse_set(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->line = line;
  parse_assign_target(*stmt, {}, true);
  if (skip_op("=")) {
    stmt->kind = StmtKind::kSet;
    stmt->expr = parse_tuple(true);
    end_statement("set");
    return stmt;
  }
  // {% set x %}...{% endset %}, optionally {% set x | filter %}
  stmt->kind = StmtKind::kSetBlock;
  if (at_op("|")) stmt->expr = parse_filter(nullptr, false);
  end_statement("set");
  stmt->body = parse_body({"endset"}, "set", line);
  next();
  end_statement("endset");
  return stmt;
}

StmtPtr Parser::parse_macro(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kMacro;
  stmt->line = line;
  stmt->text = expect_name();
  stmt->params = parse_signature();
  end_statement("macro");
  const int saved_depth = loop_depth_;
  loop_depth_ = 0;  // a macro's body is not inside the caller's loop
  macro_stack_.push_back(stmt.get());
  stmt->body = parse_body({"endmacro"}, "macro", line);
  macro_stack_.pop_back();
  loop_depth_ = saved_depth;
  next();
  end_statement("endmacro");
  return stmt;
}

StmtPtr Parser::parse_call_block(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kCallBlock;
  stmt->line = line;
  if (at_op("(")) stmt->params = parse_signature();
  stmt->expr = parse_expression();
  if (stmt->expr->kind != ExprKind::kCall) fail("{% call %} needs a call expression");
  end_statement("call");
  const int saved_depth = loop_depth_;
  loop_depth_ = 0;
  macro_stack_.push_back(stmt.get());
  stmt->body = parse_body({"endcall"}, "call", line);
  macro_stack_.pop_back();
  loop_depth_ = saved_depth;
  next();
  end_statement("endcall");
  return stmt;
}

StmtPtr Parser::parse_filter_block(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kFilterBlock;
  stmt->line = line;
  stmt->expr = parse_filter(nullptr, true);
  end_statement("filter");
  stmt->body = parse_body({"endfilter"}, "filter", line);
  next();
  end_statement("endfilter");
  return stmt;
}

StmtPtr Parser::parse_with(int line) {
  auto stmt = std::make_unique<Stmt>();
  stmt->kind = StmtKind::kWith;
  stmt->line = line;
  while (current().type != TokenType::kBlockEnd) {
    if (!stmt->assignments.empty()) expect_op(",");
    std::string name = expect_name();
    expect_op("=");
    stmt->assignments.emplace_back(std::move(name), parse_expression());
  }
  end_statement("with");
  stmt->body = parse_body({"endwith"}, "with", line);
  next();
  end_statement("endwith");
  return stmt;
}

// `x`, `a, b`, `(a, b)`, or with_namespace `ns.attr`.
void Parser::parse_assign_target(Stmt& stmt, std::initializer_list<const char*> extra_end,
                                 bool with_namespace) {
  if (with_namespace && current().type == TokenType::kName && look().type == TokenType::kOperator &&
      look().value == ".") {
    stmt.targets.push_back(next().value);
    next();
    stmt.attribute = expect_name();
    return;
  }
  const bool parenthesized = skip_op("(");
  while (true) {
    const std::string name = expect_name();
    if (name == "true" || name == "false" || name == "none" || name == "True" || name == "False" ||
        name == "None")
      fail("cannot assign to '" + name + "'");
    stmt.targets.push_back(name);
    if (!skip_op(",")) break;
    stmt.unpack = true;
    if (parenthesized ? at_op(")") : (is_tuple_end(extra_end) || at_op("="))) break;
  }
  if (parenthesized) {
    expect_op(")");
    stmt.unpack = true;
  }
}

std::vector<Param> Parser::parse_signature() {
  std::vector<Param> params;
  expect_op("(");
  while (!at_op(")")) {
    if (!params.empty()) expect_op(",");
    Param param;
    param.name = expect_name();
    if (skip_op("=")) {
      param.default_value = parse_expression();
    } else if (!params.empty() && params.back().default_value) {
      fail("non-default argument follows default argument");
    }
    params.push_back(std::move(param));
  }
  next();
  return params;
}

}  // namespace shardtrain::detail::jinja
