// The expression half of the interpreter, and Python's operators on template values.
#include <cmath>

#include "data/jinja_eval.h"
#include "data/jinja_filters.h"
#include "data/jinja_unicode.h"

namespace shardtrain::detail::jinja {
namespace {

[[noreturn]] void operand_error(const std::string& op, const Value& a, const Value& b) {
  throw JinjaError("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                   type_name(b) + "'");
}

[[noreturn]] void too_big() { unsupported("integer arithmetic beyond 64 bits"); }

Value repeat(const Value& seq, int64_t times) {
  // Python would build it; a prompt never needs a gigabyte, and an error beats running out of
  // memory.
  const size_t unit = seq.is_string() ? seq.as_string().size() : seq.items().size() * 64;
  if (times > 0 && unit > 0 && static_cast<uint64_t>(times) > (size_t{1} << 28) / unit)
    unsupported("repeating a sequence to more than 256 MiB");
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return Value::str(std::move(out));
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out), seq.is_tuple());
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  const bool ints = !a.is_float() && !b.is_float();
  const int64_t x = ints ? a.as_int() : 0, y = ints ? b.as_int() : 0;
  const double p = a.as_float(), q = b.as_float();
  int64_t r = 0;
  if (op == "+") {
    if (!ints) return Value::real(p + q);
    if (__builtin_add_overflow(x, y, &r)) too_big();
    return Value::integer(r);
  }
  if (op == "-") {
    if (!ints) return Value::real(p - q);
    if (__builtin_sub_overflow(x, y, &r)) too_big();
    return Value::integer(r);
  }
  if (op == "*") {
    if (!ints) return Value::real(p * q);
    if (__builtin_mul_overflow(x, y, &r)) too_big();
    return Value::integer(r);
  }
  if (op == "/") {
    if (q == 0) throw JinjaError("division by zero");
    return Value::real(p / q);
  }
  if (op == "//" || op == "%") {
    if (q == 0) throw JinjaError(op == "%" ? "modulo by zero" : "division by zero");
    if (ints && x == INT64_MIN && y == -1) too_big();
    if (ints) {
      // Python rounds the quotient toward negative infinity; the remainder takes y's sign.
      int64_t quot = x / y, rem = x % y;
      if (rem != 0 && ((rem < 0) != (y < 0))) --quot, rem += y;
      return Value::integer(op == "//" ? quot : rem);
    }
    // CPython's float_divmod, step for step.
    double mod = std::fmod(p, q), div = (p - mod) / q;
    if (mod != 0) {
      if ((q < 0) != (mod < 0)) mod += q, div -= 1.0;
    } else {
      mod = std::copysign(0.0, q);
    }
    double floordiv = std::copysign(0.0, p / q);
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    }
    return Value::real(op == "//" ? floordiv : mod);
  }
  // "**"
  if (ints && y >= 0) {
    int64_t result = 1, base = x;
    for (int64_t e = y; e > 0; e >>= 1) {
      if ((e & 1) && __builtin_mul_overflow(result, base, &result)) too_big();
      if (e > 1 && __builtin_mul_overflow(base, base, &base)) too_big();
    }
    return Value::integer(result);
  }
  if (p == 0 && q < 0) throw JinjaError("0.0 cannot be raised to a negative power");
  const double result = std::pow(p, q);
  if (std::isnan(result)) unsupported("a complex result of **");
  if (std::isinf(result) && std::isfinite(p) && std::isfinite(q))
    throw JinjaError("numerical result out of range (OverflowError)");
  return Value::real(result);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;  // Undefined iterates as empty
    case Value::Kind::kString:
      if (!item.is_string())
        throw JinjaError("'in <string>' requires string as left operand, not " + type_name(item));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.items())
        if (equals(v, item)) return true;
      return false;
    case Value::Kind::kDict:
      if ((item.is_list() && !item.is_tuple()) || item.is_dict() || item.is_namespace())
        throw JinjaError("unhashable type: '" + type_name(item) + "'");
      return container.dict_data().find(item) != nullptr;
    default:
      throw JinjaError("argument of type '" + type_name(container) + "' is not iterable");
  }
}

}  // namespace

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::str(to_str(a) + to_str(b));
  require_defined(a);
  require_defined(b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::str(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(items), a.is_tuple());
    }
    if (a.is_string() || a.is_list())
      throw JinjaError("can only concatenate " + type_name(a) + " (not \"" + type_name(b) +
                       "\") to " + type_name(a));
  }
  if (op == "*") {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
  }
  if (op == "%" && a.is_string()) unsupported("the % string formatting operator");
  operand_error(op, a, b);
}

bool compare_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "in") return contains(b, a);
  if (op == "notin") return !contains(b, a);
  const int c = compare(a, b, op.c_str());
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;  // ">="
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& entry : v.dict_data().entries) keys.push_back(entry.first);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      std::string ch;
      for (char32_t c : utf8_decode(v.as_string())) {
        ch.clear();
        utf8_append(ch, c);
        chars.push_back(Value::str(ch));
      }
      return chars;
    }
    default:
      throw JinjaError("'" + type_name(v) + "' object is not iterable");
  }
}

Value Interpreter::eval(const Expr& expr, Scope& scope) {
  try {
    return eval_node(expr, scope);
  } catch (const JinjaError& e) {
    if (e.line != 0) throw;
    throw JinjaError(e.what(), expr.line, e.raised);
  }
}

CallArgs Interpreter::eval_args(const Expr& expr, Scope& scope) {
  CallArgs args;
  for (size_t i = 1; i < expr.operands.size(); ++i)
    args.positional.push_back(eval(*expr.operands[i], scope));
  for (const auto& [key, value] : expr.kwargs) args.keyword.emplace_back(key, eval(*value, scope));
  return args;
}

// A filter chain; in a filter block or `set x | f` block the innermost subject is `block_text`.
Value Interpreter::eval_filter(const Expr& expr, Scope& scope, const Value* block_text) {
  const Expr* inner = expr.operands[0].get();
  const Value subject = !inner ? *block_text
                        : inner->kind == ExprKind::kFilter && block_text
                            ? eval_filter(*inner, scope, block_text)
                            : eval(*inner, scope);
  try {
    return apply_filter(expr.name, subject, eval_args(expr, scope));
  } catch (const JinjaError& e) {
    if (e.line != 0) throw;
    throw JinjaError(e.what(), expr.line, e.raised);
  }
}

Value Interpreter::eval_node(const Expr& expr, Scope& scope) {
  const auto& ops = expr.operands;
  switch (expr.kind) {
    case ExprKind::kConst:
      return expr.constant;
    case ExprKind::kName: {
      const Value* v = scope.find(expr.name);
      return v ? *v : Value::undefined("'" + expr.name + "' is undefined");
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      for (const auto& e : ops) items.push_back(eval(*e, scope));
      return Value::list(std::move(items), expr.kind == ExprKind::kTuple);
    }
    case ExprKind::kDict: {
      DictData d;
      for (size_t i = 0; i + 1 < ops.size(); i += 2) {
        Value key = eval(*ops[i], scope);
        if ((key.is_list() && !key.is_tuple()) || key.is_dict() || key.is_namespace() ||
            key.is_undefined())
          throw JinjaError("unhashable type: '" + type_name(key) + "'");
        d.set(std::move(key), eval(*ops[i + 1], scope));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::kGetattr: {
      const Value object = eval(*ops[0], scope);
      require_defined(object);
      return get_attribute(object, expr.name);
    }
    case ExprKind::kGetitem: {
      const Value object = eval(*ops[0], scope);
      require_defined(object);
      return get_item(object, eval(*ops[1], scope));
    }
    case ExprKind::kSlice: {
      const Value object = eval(*ops[0], scope);
      require_defined(object);
      Value bounds[3];
      for (int i = 0; i < 3; ++i)
        if (ops[1 + i]) bounds[i] = eval(*ops[1 + i], scope);
      return get_slice(object, ops[1] ? &bounds[0] : nullptr, ops[2] ? &bounds[1] : nullptr,
                       ops[3] ? &bounds[2] : nullptr);
    }
    case ExprKind::kCall: {
      const Value callee = eval(*ops[0], scope);
      require_defined(callee);
      if (!callee.is_function())
        throw JinjaError("'" + type_name(callee) + "' object is not callable");
      return callee.function_data().call(eval_args(expr, scope));
    }
    case ExprKind::kFilter:
      return eval_filter(expr, scope, nullptr);
    case ExprKind::kTest: {
      const Value subject = eval(*ops[0], scope);
      return Value::boolean(apply_test(expr.name, subject, eval_args(expr, scope)) != expr.negated);
    }
    case ExprKind::kUnary: {
      const Value v = eval(*ops[0], scope);
      if (expr.name == "not") return Value::boolean(!truthy(v));
      require_defined(v);
      if (!v.is_number())
        throw JinjaError("bad operand type for unary " + expr.name + ": '" + type_name(v) + "'");
      if (expr.name == "+") return v.is_bool() ? Value::integer(v.as_int()) : v;
      if (v.is_float()) return Value::real(-v.as_float());
      if (v.as_int() == INT64_MIN) too_big();
      return Value::integer(-v.as_int());
    }
    case ExprKind::kBinary: {
      Value left = eval(*ops[0], scope);
      if (expr.name == "and") return truthy(left) ? eval(*ops[1], scope) : left;
      if (expr.name == "or") return truthy(left) ? left : eval(*ops[1], scope);
      return binary_op(expr.name, left, eval(*ops[1], scope));
    }
    case ExprKind::kCompare: {
      // Chained like Python: a < b < c is a < b and b < c, each operand evaluated once.
      Value left = eval(*ops[0], scope);
      for (size_t i = 0; i < expr.ops.size(); ++i) {
        Value right = eval(*ops[i + 1], scope);
        if (!compare_op(expr.ops[i], left, right)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case ExprKind::kCondExpr:
      if (truthy(eval(*ops[0], scope))) return eval(*ops[1], scope);
      if (ops[2]) return eval(*ops[2], scope);
      return Value::undefined("the inline if-expression on line " + std::to_string(expr.line) +
                              " evaluated to false and no else section was defined.");
  }
  return Value();
}

}  // namespace shardtrain::detail::jinja
