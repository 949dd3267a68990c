// Jinja's builtin filters (jinja2/filters.py) with transformers' tojson, in Python's semantics:
// string filters stringify their operand first (`5|upper` is "5"), and an undefined operand is
// an empty sequence to `length`, `first` and `list`. The filters over sequences are in
// jinja_filters_seq.cpp.
#include "data/jinja_filters.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "data/jinja_eval.h"
#include "data/jinja_json.h"
#include "data/jinja_unicode.h"

namespace shardtrain::detail::jinja {
namespace {

constexpr const char* kMissing = "\x01missing";

constexpr const char* kFilters[] = {
    "abs",     "capitalize", "count", "d",      "default", "dictsort",   "first",
    "float",   "indent",     "int",   "items",  "join",    "last",       "length",
    "list",    "lower",      "map",   "max",    "min",     "reject",     "rejectattr",
    "replace", "reverse",    "round", "safe",   "select",  "selectattr", "sort",
    "string",  "sum",        "title", "tojson", "trim",    "unique",     "upper"};
// Jinja builtins left out: HTML escaping has no place in a prompt, the rest no chat template uses.
constexpr const char* kRefusedFilters[] = {
    "attr",      "batch",   "center",    "e",        "escape", "filesizeformat", "forceescape",
    "format",    "groupby", "pprint",    "random",   "slice",  "striptags",      "truncate",
    "urlencode", "urlize",  "wordcount", "wordwrap", "xmlattr"};

int64_t py_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(code_point_count(v.as_string()));
    case Value::Kind::kList:
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict_data().entries.size());
    default:
      throw JinjaError("object of type '" + type_name(v) + "' has no len()");
  }
}

// Python's float(str): optional sign, digits with a fraction and exponent, inf, nan.
bool parse_py_float(const std::string& text, double& out) {
  std::string s = py_strip(text, std::nullopt, true, true);
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  std::string body = s;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body = body.substr(1);
  std::string lower = py_lower(body);
  const bool special = lower == "inf" || lower == "infinity" || lower == "nan";
  if (!special) {
    if (body.empty() || body.find_first_not_of("0123456789.eE+-") != std::string::npos ||
        body.find_first_of("xX") != std::string::npos)
      return false;
  }
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end && *end == '\0' && end != s.c_str();
}

// Python's int(str, base), underscores and a matching 0x / 0o / 0b prefix allowed.
bool parse_py_int(const std::string& text, int64_t base, int64_t& out) {
  std::string s = py_strip(text, std::nullopt, true, true);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) negative = s[0] == '-', s = s.substr(1);
  if (s.size() > 2 && s[0] == '0') {
    const char p = static_cast<char>(std::tolower(s[1]));
    if ((p == 'x' && base == 16) || (p == 'o' && base == 8) || (p == 'b' && base == 2))
      s = s.substr(2);
  }
  if (s.empty() || s.front() == '_' || s.back() == '_' || s.find("__") != std::string::npos)
    return false;
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  uint64_t value = 0;
  for (char c : s) {
    const int digit = std::isdigit(static_cast<unsigned char>(c))   ? c - '0'
                      : std::isalpha(static_cast<unsigned char>(c)) ? std::tolower(c) - 'a' + 10
                                                                    : 99;
    if (digit >= base) return false;
    if (value > (static_cast<uint64_t>(INT64_MAX) - static_cast<uint64_t>(digit)) /
                    static_cast<uint64_t>(base))
      unsupported("an integer beyond 64 bits");
    value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(digit);
  }
  out = negative ? -static_cast<int64_t>(value) : static_cast<int64_t>(value);
  return true;
}

Value filter_int(const Value& v, const std::vector<Value>& a) {
  const Value fallback = given(a[0]) ? a[0] : Value::integer(0);
  const int64_t base = given(a[1]) ? need_int(a[1], "int's base") : 10;
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) {
    if (!std::isfinite(v.as_float())) return fallback;
    return Value::integer(static_cast<int64_t>(std::trunc(v.as_float())));
  }
  if (!v.is_string()) return fallback;
  int64_t i = 0;
  if (parse_py_int(v.as_string(), base, i)) return Value::integer(i);
  double d = 0;  // "42.23"|int is 42: Jinja retries through float()
  if (parse_py_float(v.as_string(), d) && std::isfinite(d))
    return Value::integer(static_cast<int64_t>(std::trunc(d)));
  return fallback;
}

Value filter_float(const Value& v, const std::vector<Value>& a) {
  const Value fallback = given(a[0]) ? a[0] : Value::real(0.0);
  if (v.is_number()) return Value::real(v.as_float());
  double d = 0;
  if (v.is_string() && parse_py_float(v.as_string(), d)) return Value::real(d);
  return fallback;
}

Value filter_round(const Value& v, const std::vector<Value>& a) {
  const int64_t precision = given(a[0]) ? need_int(a[0], "round's precision") : 0;
  const std::string method = given(a[1]) ? need_string(a[1], "round's method") : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    throw JinjaError("round's method must be common, ceil or floor");
  require_defined(v);
  if (!v.is_number()) throw JinjaError("type " + type_name(v) + " doesn't define __round__");
  if (precision < 0 || precision > 17)
    unsupported("round() to precision " + std::to_string(precision));
  if (method == "common") {
    if (!v.is_float()) return Value::integer(v.as_int());
    // printf rounds the exact binary value half-to-even, as Python's round() does.
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), v.as_float());
    return Value::real(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_float() * scale;
  return Value::real((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value filter_indent(const Value& v, const std::vector<Value>& a) {
  // Jinja appends "\n" to the operand without making it a string first.
  require_defined(v);
  if (!v.is_string())
    throw JinjaError("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  std::string indention(4, ' ');
  if (given(a[0]) && a[0].is_string()) {
    indention = a[0].as_string();
  } else if (given(a[0])) {
    const int64_t width = need_int(a[0], "indent's width");
    indention.assign(static_cast<size_t>(std::max<int64_t>(0, width)), ' ');
  }
  const bool first = given(a[1]) && truthy(a[1]);
  const bool blank = given(a[2]) && truthy(a[2]);
  const std::vector<std::string> lines = py_splitlines(v.as_string() + "\n");
  std::string rv;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) rv += '\n';
    if (i > 0 && (blank || !lines[i].empty())) rv += indention;
    rv += lines[i];
  }
  return Value::str(first ? indention + rv : rv);
}

Value filter_tojson(const Value& v, const std::vector<Value>& a) {
  JsonOptions opt;
  opt.ensure_ascii = given(a[0]) && truthy(a[0]);
  if (given(a[1]) && !a[1].is_none()) {
    opt.indent_set = true;
    if (a[1].is_string()) {
      opt.indent = a[1].as_string();
    } else if (a[1].is_int() || a[1].is_bool()) {
      opt.indent.assign(static_cast<size_t>(std::max<int64_t>(0, a[1].as_int())), ' ');
    } else {
      throw JinjaError("tojson's indent must be an integer or a string, not " + type_name(a[1]));
    }
  }
  if (given(a[2]) && !a[2].is_none()) {
    if (!a[2].is_list() || a[2].items().size() != 2)
      throw JinjaError("tojson's separators must be a pair of strings");
    opt.separators_set = true;
    opt.item_separator = need_string(a[2].items()[0], "a separator");
    opt.key_separator = need_string(a[2].items()[1], "a separator");
  }
  opt.sort_keys = given(a[3]) && truthy(a[3]);
  return Value::str(to_json(v, opt));
}

}  // namespace

Support filter_support(const std::string& name) {
  return listed(kFilters, name)          ? Support::kSupported
         : listed(kRefusedFilters, name) ? Support::kUnsupported
                                         : Support::kUnknown;
}

std::vector<Value> bind_args(const std::string& what, const CallArgs& args,
                             std::initializer_list<const char*> names) {
  std::vector<Value> slots(names.size(), Value::undefined(kMissing));
  if (args.positional.size() > names.size())
    throw JinjaError(what + " takes at most " + std::to_string(names.size()) + " argument(s) (" +
                     std::to_string(args.positional.size()) + " given)");
  std::copy(args.positional.begin(), args.positional.end(), slots.begin());
  for (const auto& [key, value] : args.keyword) {
    const std::string& wanted = key;  // C++17 lambdas cannot capture a structured binding
    const auto it =
        std::find_if(names.begin(), names.end(), [&](const char* n) { return wanted == n; });
    if (it == names.end())
      throw JinjaError(what + " got an unexpected keyword argument '" + key + "'");
    Value& slot = slots[static_cast<size_t>(it - names.begin())];
    if (given(slot)) throw JinjaError(what + " got multiple values for argument '" + key + "'");
    slot = value;
  }
  return slots;
}

bool given(const Value& slot) { return !slot.is_undefined() || slot.undefined_hint() != kMissing; }

std::string need_string(const Value& v, const std::string& what) {
  if (!v.is_string()) throw JinjaError(what + " must be a string, not " + type_name(v));
  return v.as_string();
}

int64_t need_int(const Value& v, const std::string& what) {
  if (!v.is_int() && !v.is_bool())
    throw JinjaError(what + " must be an integer, not " + type_name(v));
  return v.as_int();
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& args) {
  auto bind = [&](std::initializer_list<const char*> names) {
    return bind_args(name, args, names);
  };
  if (name == "default" || name == "d") {
    const auto a = bind({"default_value", "boolean"});
    const bool use = v.is_undefined() || (given(a[1]) && truthy(a[1]) && !truthy(v));
    return use ? (given(a[0]) ? a[0] : Value::str("")) : v;
  }
  if (name == "safe" || name == "string") return bind({}), Value::str(to_str(v));
  if (name == "tojson")
    return filter_tojson(v, bind({"ensure_ascii", "indent", "separators", "sort_keys"}));
  if (name == "trim") {
    const auto a = bind({"chars"});
    std::optional<std::string> chars;
    if (given(a[0]) && !a[0].is_none()) chars = to_str(a[0]);
    return Value::str(py_strip(to_str(v), chars, true, true));
  }
  if (name == "length" || name == "count") return bind({}), Value::integer(py_len(v));
  if (name == "upper") return bind({}), Value::str(py_upper(to_str(v)));
  if (name == "lower") return bind({}), Value::str(py_lower(to_str(v)));
  if (name == "capitalize") return bind({}), Value::str(py_capitalize(to_str(v)));
  if (name == "title") {
    // Jinja's own title: a word starts after a space, '-', '(', '{', '[' or '<'.
    bind({});
    std::u32string cps = utf8_decode(to_str(v));
    bool start = true;
    for (char32_t& c : cps) {
      c = start ? py_upper(c) : py_lower(c);
      start = py_isspace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    }
    return Value::str(utf8_encode(cps));
  }
  if (name == "replace") {
    const auto a = bind({"old", "new", "count"});
    if (!given(a[0]) || !given(a[1])) throw JinjaError("replace needs the old and new text");
    const int64_t count = given(a[2]) && !a[2].is_none() ? need_int(a[2], "replace's count") : -1;
    return Value::str(py_replace(to_str(v), to_str(a[0]), to_str(a[1]), count));
  }
  if (name == "int") return filter_int(v, bind({"default", "base"}));
  if (name == "float") return filter_float(v, bind({"default"}));
  if (name == "round") return filter_round(v, bind({"precision", "method"}));
  if (name == "abs") {
    bind({});
    require_defined(v);
    if (!v.is_number()) throw JinjaError("bad operand type for abs(): '" + type_name(v) + "'");
    if (v.is_float()) return Value::real(std::fabs(v.as_float()));
    return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
  }
  if (name == "indent") return filter_indent(v, bind({"width", "first", "blank"}));
  if (name == "first" || name == "last") {
    bind({});
    const std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined("No " + name + " item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return bind({}), Value::list(iterate(v));
  if (name == "reverse") {
    bind({});
    if (v.is_string()) {
      std::u32string cps = utf8_decode(v.as_string());
      std::reverse(cps.begin(), cps.end());
      return Value::str(utf8_encode(cps));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "items") {
    bind({});
    if (v.is_undefined()) return Value::list({});
    if (!v.is_dict()) throw JinjaError("Can only get item pairs from a mapping.");
    std::vector<Value> pairs;
    for (const auto& [k, val] : v.dict_data().entries) pairs.push_back(Value::list({k, val}, true));
    return Value::list(std::move(pairs));
  }
  return apply_sequence_filter(name, v, args);
}

}  // namespace shardtrain::detail::jinja
