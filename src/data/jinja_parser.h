// Jinja's grammar, read the way jinja2/parser.py reads it (operator precedence, tuples without
// parentheses, `is` tests taking one bare argument, `for ... if ...`), into the tree of
// jinja_ast.h. What the interpreter does not implement is refused here, at parse time, so that a
// template either renders as Jinja would or does not load at all.
#pragma once

#include <initializer_list>
#include <string_view>
#include <vector>

#include "data/jinja_ast.h"
#include "data/jinja_lexer.h"

namespace shardtrain::detail::jinja {

// Throws JinjaError with the line for a syntax error or an unsupported construct.
Program parse(std::string_view source);

// The parser's state; its statement half is in jinja_parser.cpp, its expression half in
// jinja_parse_expr.cpp.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}
  Program parse_program();

 private:
  // Statements.
  Body parse_body(std::initializer_list<const char*> end_tags, const char* opener, int line,
                  std::string* found_end = nullptr);
  StmtPtr parse_statement();
  StmtPtr parse_if(int line);
  StmtPtr parse_for(int line);
  StmtPtr parse_set(int line);
  StmtPtr parse_macro(int line);
  StmtPtr parse_call_block(int line);
  StmtPtr parse_filter_block(int line);
  StmtPtr parse_with(int line);
  void parse_assign_target(Stmt& stmt, std::initializer_list<const char*> extra_end,
                           bool with_namespace);
  std::vector<Param> parse_signature();
  void end_statement(const char* tag);

  // Expressions.
  ExprPtr parse_expression(bool with_condexpr = true);
  ExprPtr parse_tuple(bool with_condexpr, std::initializer_list<const char*> extra_end = {},
                      bool explicit_parentheses = false);
  ExprPtr parse_condexpr();
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter = true);
  ExprPtr parse_primary();
  ExprPtr parse_postfix(ExprPtr node);
  ExprPtr parse_filter_expr(ExprPtr node);
  ExprPtr parse_subscript(ExprPtr node);
  ExprPtr parse_subscribed();
  ExprPtr parse_call(ExprPtr callee);
  ExprPtr parse_filter(ExprPtr node, bool start_inline);
  ExprPtr parse_test(ExprPtr node);
  void parse_call_args(Expr& call);
  bool is_tuple_end(std::initializer_list<const char*> extra_end) const;

  // Token stream.
  const Token& current() const { return tokens_[pos_]; }
  const Token& look(size_t ahead = 1) const;
  Token next();
  bool at_op(const char* op) const;
  bool at_name(const char* name) const;
  bool skip_op(const char* op);
  bool skip_name(const char* name);
  void expect_op(const char* op);
  std::string expect_name();
  [[noreturn]] void fail(const std::string& message) const;
  [[noreturn]] void fail_unexpected(const char* expected) const;

  // Bounds the parser's recursion (and so the interpreter's): a template nested deeper than
  // this fails with a message rather than overflowing the stack.
  class DepthGuard {
   public:
    explicit DepthGuard(Parser& parser);
    ~DepthGuard() { --parser_.depth_; }

   private:
    Parser& parser_;
  };

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;              // {% break %} is only valid inside a loop
  std::vector<Stmt*> macro_stack_;  // macros being parsed: where varargs/kwargs/caller count
};

}  // namespace shardtrain::detail::jinja
