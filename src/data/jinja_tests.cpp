// Jinja's builtin tests (jinja2/tests.py): `x is defined`, `x is string`, `n is divisibleby 3`.
#include <algorithm>

#include "data/jinja_eval.h"
#include "data/jinja_filters.h"
#include "data/jinja_unicode.h"

namespace shardtrain::detail::jinja {
namespace {

constexpr const char* kTests[] = {"boolean",     "callable", "defined",  "divisibleby", "eq",
                                  "equalto",     "==",       "ne",       "!=",          "lt",
                                  "lessthan",    "<",        "le",       "<=",          "gt",
                                  "greaterthan", ">",        "ge",       ">=",          "even",
                                  "odd",         "false",    "true",     "filter",      "test",
                                  "float",       "integer",  "in",       "iterable",    "lower",
                                  "upper",       "mapping",  "none",     "number",      "sameas",
                                  "sequence",    "string",   "undefined"};

Value argument(const std::string& test, const CallArgs& args) {
  const std::vector<Value> a = bind_args("test '" + test + "'", args, {"other"});
  if (!given(a[0])) throw JinjaError("test '" + test + "' needs an argument");
  return a[0];
}

bool remainder_is(const Value& v, const Value& divisor, int64_t want) {
  return equals(binary_op("%", v, divisor), Value::integer(want));
}

}  // namespace

Support test_support(const std::string& name) {
  if (std::any_of(std::begin(kTests), std::end(kTests), [&](const char* t) { return name == t; }))
    return Support::kSupported;
  return name == "escaped" ? Support::kUnsupported : Support::kUnknown;
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  using K = Value::Kind;
  static const char* const kWithArgument[] = {
      "divisibleby", "eq", "equalto", "==",          "ne", "!=", "lt", "lessthan", "<",
      "le",          "<=", "gt",      "greaterthan", ">",  "ge", ">=", "in",       "sameas"};
  if (std::none_of(std::begin(kWithArgument), std::end(kWithArgument),
                   [&](const char* t) { return name == t; }))
    bind_args("test '" + name + "'", args, {});  // refuses arguments it does not take
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();  // bool is a Number in Python
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "callable") return v.is_function();
  if (name == "iterable" || name == "sequence")
    return v.kind() == K::kString || v.kind() == K::kList || v.kind() == K::kDict ||
           v.kind() == K::kUndefined;  // Undefined has __iter__, __len__ and __getitem__
  if (name == "lower") return py_islower(to_str(v));
  if (name == "upper") return py_isupper(to_str(v));
  if (name == "filter" || name == "test") {
    if (!v.is_string()) return false;
    return (name == "filter" ? filter_support(v.as_string()) : test_support(v.as_string())) !=
           Support::kUnknown;
  }
  if (name == "odd") return remainder_is(v, Value::integer(2), 1);
  if (name == "even") return remainder_is(v, Value::integer(2), 0);
  const Value other = argument(name, args);
  if (name == "divisibleby") return remainder_is(v, other, 0);
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, other);
  if (name == "ne" || name == "!=") return !equals(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return compare_op("<", v, other);
  if (name == "le" || name == "<=") return compare_op("<=", v, other);
  if (name == "gt" || name == "greaterthan" || name == ">") return compare_op(">", v, other);
  if (name == "ge" || name == ">=") return compare_op(">=", v, other);
  if (name == "in") return compare_op("in", v, other);
  if (name == "sameas") return v.same_object(other);
  unsupported("the test '" + name + "'");
}

}  // namespace shardtrain::detail::jinja
