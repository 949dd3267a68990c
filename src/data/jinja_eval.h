// Renders a parsed template. Scoping is Jinja's: a for loop gives every iteration a fresh scope
// (a `set` in one iteration is gone in the next and after the loop), a macro call and a
// {% with %} get their own, an {% if %} does not, and a namespace is shared by reference, which
// is why templates carry state out of loops with `{% set ns.x = ... %}`.
#pragma once

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "data/jinja_ast.h"
#include "data/jinja_value.h"

namespace shardtrain::detail::jinja {

using Variables = std::vector<std::pair<std::string, Value>>;

// The globals every template sees: range, dict, namespace, and transformers' raise_exception and
// strftime_now. Variables of the same name passed to render() win.
Variables builtin_globals();

// Renders `program` with `variables`. Throws JinjaError (line filled in) on a rendering error or
// when the template calls raise_exception (then `raised` is set).
std::string render(const Program& program, const Variables& variables);

struct Scope {
  Scope* parent = nullptr;
  Variables vars;
  const Value* find(const std::string& name) const;
  void set(const std::string& name, Value value);
};

// The state of one render; jinja_eval.cpp runs statements, jinja_eval_expr.cpp evaluates
// expressions.
class Interpreter {
 public:
  std::string run(const Program& program, const Variables& variables);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // Scopes live as long as the render: a macro keeps a pointer to the scope it was defined in.
  Scope& new_scope(Scope* parent);
  Flow exec_body(const Body& body, Scope& scope, std::string& out);
  Flow exec(const Stmt& stmt, Scope& scope, std::string& out);
  void exec_for(const Stmt& stmt, Scope& scope, std::string& out);
  void assign(const Stmt& stmt, Scope& scope, Value value);
  Value make_macro(const Stmt& stmt, Scope& closure, const std::string& name);
  Value call_macro(const Stmt& stmt, Scope& closure, const std::string& name, const CallArgs& args);

  Value eval(const Expr& expr, Scope& scope);
  Value eval_node(const Expr& expr, Scope& scope);
  CallArgs eval_args(const Expr& expr, Scope& scope);
  Value eval_filter(const Expr& expr, Scope& scope, const Value* block_text);

  std::deque<Scope> scopes_;
  int macro_depth_ = 0;
};

// Python's operators on values: + - * / // % ** ~ and the comparisons (== != < <= > >= in notin).
Value binary_op(const std::string& op, const Value& a, const Value& b);
bool compare_op(const std::string& op, const Value& a, const Value& b);
// The items a for loop visits: a list's items, a dict's keys, a string's characters.
std::vector<Value> iterate(const Value& v);

}  // namespace shardtrain::detail::jinja
