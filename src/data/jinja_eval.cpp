// The statement half of the interpreter: output, if, for, set, macros, call and filter blocks.
#include "data/jinja_eval.h"

#include <algorithm>

#include "data/jinja_filters.h"

namespace shardtrain::detail::jinja {
namespace {

// Python's recursion limit turns runaway recursion into an error; so does this, long before the
// C++ stack would overflow.
constexpr int kMaxMacroDepth = 256;

// A JinjaError from below that does not know its line yet gets `line`.
[[noreturn]] void rethrow_at(const JinjaError& e, int line) {
  if (e.line != 0) throw e;
  throw JinjaError(e.what(), line, e.raised);
}

}  // namespace

std::string render(const Program& program, const Variables& variables) {
  return Interpreter().run(program, variables);
}

const Value* Scope::find(const std::string& name) const {
  for (const Scope* s = this; s; s = s->parent)
    for (auto it = s->vars.rbegin(); it != s->vars.rend(); ++it)
      if (it->first == name) return &it->second;
  return nullptr;
}

void Scope::set(const std::string& name, Value value) {
  for (auto& [n, v] : vars) {
    if (n == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(name, std::move(value));
}

Scope& Interpreter::new_scope(Scope* parent) {
  scopes_.emplace_back();
  scopes_.back().parent = parent;
  return scopes_.back();
}

std::string Interpreter::run(const Program& program, const Variables& variables) {
  Scope& globals = new_scope(nullptr);
  globals.vars = builtin_globals();
  for (const auto& [name, value] : variables) globals.set(name, value);
  // Template-level `set`s go into a scope of their own so that globals stay as given.
  Scope& root = new_scope(&globals);
  std::string out;
  exec_body(program.body, root, out);
  return out;
}

Interpreter::Flow Interpreter::exec_body(const Body& body, Scope& scope, std::string& out) {
  for (const auto& stmt : body) {
    const Flow flow = exec(*stmt, scope, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::exec(const Stmt& stmt, Scope& scope, std::string& out) {
  try {
    switch (stmt.kind) {
      case StmtKind::kText:
        out += stmt.text;
        break;
      case StmtKind::kOutput:
        out += to_str(eval(*stmt.expr, scope));
        break;
      case StmtKind::kIf:
        for (const auto& [test, body] : stmt.branches)
          if (truthy(eval(*test, scope))) return exec_body(body, scope, out);
        return exec_body(stmt.else_body, scope, out);
      case StmtKind::kFor:
        exec_for(stmt, scope, out);
        break;
      case StmtKind::kSet:
        assign(stmt, scope, eval(*stmt.expr, scope));
        break;
      case StmtKind::kSetBlock: {
        std::string text;
        exec_body(stmt.body, new_scope(&scope), text);
        Value value = Value::str(std::move(text));
        assign(stmt, scope, stmt.expr ? eval_filter(*stmt.expr, scope, &value) : value);
        break;
      }
      case StmtKind::kMacro:
        scope.set(stmt.text, make_macro(stmt, scope, stmt.text));
        break;
      case StmtKind::kCallBlock: {
        // The call's arguments plus caller=, a macro whose body is the block.
        const Expr& call = *stmt.expr;
        Value callee = eval(*call.operands[0], scope);
        require_defined(callee);
        if (!callee.is_function())
          throw JinjaError("'" + type_name(callee) + "' object is not callable");
        CallArgs args = eval_args(call, scope);
        args.keyword.emplace_back("caller", make_macro(stmt, scope, "caller"));
        out += to_str(callee.function_data().call(args));
        break;
      }
      case StmtKind::kFilterBlock: {
        std::string text;
        exec_body(stmt.body, new_scope(&scope), text);
        const Value value = Value::str(std::move(text));
        out += to_str(eval_filter(*stmt.expr, scope, &value));
        break;
      }
      case StmtKind::kWith: {  // a {% break %} inside still ends the loop around it
        Scope& inner = new_scope(&scope);
        for (const auto& [name, expr] : stmt.assignments) inner.set(name, eval(*expr, scope));
        return exec_body(stmt.body, inner, out);
      }
      case StmtKind::kScope:
        return exec_body(stmt.body, new_scope(&scope), out);
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
    }
  } catch (const JinjaError& e) {
    rethrow_at(e, stmt.line);
  }
  return Flow::kNormal;
}

namespace {

// Binds one loop item (or set value) to the target names, unpacking like Python.
void bind_targets(const Stmt& stmt, Scope& scope, const Value& value) {
  if (!stmt.unpack) {
    scope.set(stmt.targets[0], value);
    return;
  }
  if (!value.is_list() && !value.is_string() && !value.is_dict())
    throw JinjaError("cannot unpack non-iterable " + type_name(value) + " object");
  const std::vector<Value> parts = iterate(value);
  const size_t want = stmt.targets.size();
  if (parts.size() > want)
    throw JinjaError("too many values to unpack (expected " + std::to_string(want) + ")");
  if (parts.size() < want)
    throw JinjaError("not enough values to unpack (expected " + std::to_string(want) + ", got " +
                     std::to_string(parts.size()) + ")");
  for (size_t i = 0; i < want; ++i) scope.set(stmt.targets[i], parts[i]);
}

Value loop_object(const std::vector<Value>& items, size_t i) {
  const size_t n = items.size();
  DictData loop;
  auto put = [&](const char* key, Value v) {
    loop.entries.emplace_back(Value::str(key), std::move(v));
  };
  put("index", Value::integer(static_cast<int64_t>(i + 1)));
  put("index0", Value::integer(static_cast<int64_t>(i)));
  put("revindex", Value::integer(static_cast<int64_t>(n - i)));
  put("revindex0", Value::integer(static_cast<int64_t>(n - i - 1)));
  put("first", Value::boolean(i == 0));
  put("last", Value::boolean(i + 1 == n));
  put("length", Value::integer(static_cast<int64_t>(n)));
  put("depth", Value::integer(1));
  put("depth0", Value::integer(0));
  if (i > 0) put("previtem", items[i - 1]);
  if (i + 1 < n) put("nextitem", items[i + 1]);
  put("cycle", Value::function("loop.cycle", [i](const CallArgs& args) {
        if (args.positional.empty()) throw JinjaError("no items for cycling given");
        return args.positional[i % args.positional.size()];
      }));
  return Value::dict(std::move(loop));
}

}  // namespace

void Interpreter::exec_for(const Stmt& stmt, Scope& scope, std::string& out) {
  std::vector<Value> items = iterate(eval(*stmt.expr, scope));
  if (stmt.condition) {
    // `for x in xs if cond`: filtered first, so loop.length and loop.last count what remains.
    std::vector<Value> kept;
    for (Value& item : items) {
      Scope& probe = new_scope(&scope);
      bind_targets(stmt, probe, item);
      if (truthy(eval(*stmt.condition, probe))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    Scope& iteration = new_scope(&scope);
    iteration.set("loop", loop_object(items, i));
    bind_targets(stmt, iteration, items[i]);
    if (exec_body(stmt.body, iteration, out) == Flow::kBreak) break;
  }
  if (items.empty()) exec_body(stmt.else_body, new_scope(&scope), out);
}

void Interpreter::assign(const Stmt& stmt, Scope& scope, Value value) {
  if (stmt.attribute.empty()) {
    bind_targets(stmt, scope, value);
    return;
  }
  const Value* ns = scope.find(stmt.targets[0]);
  if (!ns || !ns->is_namespace())
    throw JinjaError("cannot assign attribute on non-namespace object ('" + stmt.targets[0] +
                     "' is " + (ns ? type_name(*ns) : std::string("undefined")) + ")");
  ns->namespace_data().set(Value::str(stmt.attribute), std::move(value));
}

Value Interpreter::make_macro(const Stmt& stmt, Scope& closure, const std::string& name) {
  Scope* where = &closure;
  return Value::function("macro '" + name + "'", [this, &stmt, where, name](const CallArgs& args) {
    return call_macro(stmt, *where, name, args);
  });
}

// Jinja's macro call: parameters by position, then by keyword, then defaults (which may use the
// parameters before them); extra arguments only when the body reads varargs / kwargs.
Value Interpreter::call_macro(const Stmt& stmt, Scope& closure, const std::string& name,
                              const CallArgs& args) {
  if (macro_depth_ >= kMaxMacroDepth) throw JinjaError("maximum recursion depth exceeded");
  Scope& scope = new_scope(&closure);
  std::vector<std::pair<std::string, Value>> keyword = args.keyword;
  auto take_keyword = [&](const std::string& key, Value& into) {
    for (auto it = keyword.begin(); it != keyword.end(); ++it) {
      if (it->first == key) {
        into = std::move(it->second);
        keyword.erase(it);
        return true;
      }
    }
    return false;
  };
  Value caller;
  if (take_keyword("caller", caller)) scope.set("caller", caller);
  for (size_t i = 0; i < stmt.params.size(); ++i) {
    const Param& p = stmt.params[i];
    Value value;
    if (i < args.positional.size()) {
      value = args.positional[i];
    } else if (!take_keyword(p.name, value)) {
      value = p.default_value ? eval(*p.default_value, scope)
                              : Value::undefined("parameter '" + p.name + "' was not provided");
    }
    scope.set(p.name, std::move(value));
  }
  if (args.positional.size() > stmt.params.size()) {
    if (!stmt.uses_varargs)
      throw JinjaError("macro '" + name + "' takes not more than " +
                       std::to_string(stmt.params.size()) + " argument(s)");
  }
  std::vector<Value> extra(
      args.positional.begin() +
          static_cast<std::ptrdiff_t>(std::min(args.positional.size(), stmt.params.size())),
      args.positional.end());
  if (stmt.uses_varargs) scope.set("varargs", Value::list(std::move(extra), true));
  if (!keyword.empty() && !stmt.uses_kwargs)
    throw JinjaError("macro '" + name + "' takes no keyword argument '" + keyword[0].first + "'");
  if (stmt.uses_kwargs) {
    DictData kw;
    for (auto& [k, v] : keyword) kw.entries.emplace_back(Value::str(k), std::move(v));
    scope.set("kwargs", Value::dict(std::move(kw)));
  }
  std::string out;
  ++macro_depth_;
  try {
    exec_body(stmt.body, scope, out);
  } catch (...) {
    --macro_depth_;
    throw;
  }
  --macro_depth_;
  return Value::str(std::move(out));
}

}  // namespace shardtrain::detail::jinja
