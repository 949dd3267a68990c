// The syntax tree of a parsed template: expressions and statements, each with the line it came
// from so that a rendering error can name it. Nodes are plain structs with a kind and generic
// child slots (operands, body) rather than a class per node: the interpreter switches on the kind.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/jinja_value.h"

namespace shardtrain::detail::jinja {

enum class ExprKind {
  kConst,     // constant
  kName,      // name
  kList,      // operands: the items
  kTuple,     // operands: the items
  kDict,      // operands: key, value, key, value...
  kGetattr,   // operands[0].name
  kGetitem,   // operands[0][operands[1]]
  kSlice,     // operands[0][operands[1]:operands[2]:operands[3]], null where left out
  kCall,      // operands[0](operands[1...], kwargs)
  kFilter,    // operands[0] | name(operands[1...], kwargs); operands[0] is null in a filter block
  kTest,      // operands[0] is [not] name(operands[1...], kwargs)
  kUnary,     // name ("-", "+", "not") operands[0]
  kBinary,    // operands[0] name operands[1]; name: + - * / // % ** ~ and or
  kCompare,   // operands[0] ops[0] operands[1] ops[1] ...; ops: == != < <= > >= in notin
  kCondExpr,  // operands[1] if operands[0] else operands[2] (null: undefined)
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind;
  int line = 0;
  std::string name;
  Value constant;
  std::vector<ExprPtr> operands;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;  // kTest: `is not`
};

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // branches (if, elif...), else_body
  kFor,          // for targets in expr [if condition]: body [else: else_body]
  kSet,          // set targets = expr, or set targets[0].attribute = expr
  kSetBlock,     // set targets %}body{% endset; expr: an optional filter chain
  kMacro,        // macro text(params): body
  kCallBlock,    // call(params) expr: body, where body is what caller() renders
  kFilterBlock,  // filter expr: body
  kWith,         // with assignments: body
  kScope,        // transformers' {% generation %}: body, rendered as is
  kBreak,
  kContinue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;       // kText: the text; kMacro: the name
  std::string attribute;  // kSet/kSetBlock on a namespace: targets[0].attribute
  ExprPtr expr;
  ExprPtr condition;  // kFor: the `if` filter of items
  std::vector<std::string> targets;
  bool unpack = false;  // the target was a tuple (`for k, v in`), even of one name
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf
  Body body;
  Body else_body;
  std::vector<Param> params;  // kMacro, kCallBlock
  bool uses_varargs = false;  // the macro's body names varargs / kwargs / caller, so it
  bool uses_kwargs = false;   // accepts extra arguments (Jinja's rule)
  bool uses_caller = false;
  std::vector<std::pair<std::string, ExprPtr>> assignments;  // kWith
};

struct Program {
  Body body;
};

// A new expression node of `kind` at template line `line`.
inline ExprPtr make_expr(ExprKind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

}  // namespace shardtrain::detail::jinja
