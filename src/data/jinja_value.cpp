// Python semantics of template values: truthiness, equality, ordering, str() and repr().
#include "data/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "data/jinja_unicode.h"

namespace shardtrain::detail::jinja {

void unsupported(const std::string& construct, int line) {
  throw JinjaError(construct + " is not supported", line);
}

Value Value::list(std::vector<Value> items, bool tuple) {
  return Value(std::shared_ptr<const ListData>(new ListData{std::move(items), tuple}));
}
Value Value::dict(DictData data) {
  return Value(std::shared_ptr<const DictData>(new DictData(std::move(data))));
}
Value Value::namespace_(DictData attrs) {
  return Value(std::make_shared<DictData>(std::move(attrs)));
}
Value Value::function(std::string name, std::function<Value(const CallArgs&)> call) {
  return Value(std::shared_ptr<const Function>(new Function{std::move(name), std::move(call)}));
}

double Value::as_float() const {
  if (is_float()) return std::get<double>(data_);
  return static_cast<double>(as_int());
}

bool Value::same_object(const Value& other) const {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kList:
      return &list_data() == &other.list_data();
    case Kind::kDict:
      return &dict_data() == &other.dict_data();
    case Kind::kNamespace:
      return &namespace_data() == &other.namespace_data();
    case Kind::kFunction:
      return &function_data() == &other.function_data();
    default:
      return equals(*this, other);
  }
}

const Value* DictData::find(const Value& key) const {
  for (const auto& [k, v] : entries)
    if (equals(k, key)) return &v;
  return nullptr;
}

void DictData::set(Value key, Value value) {
  for (auto& [k, v] : entries) {
    if (equals(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(std::move(key), std::move(value));
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.is_tuple() ? "tuple" : "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kFunction:
      return "function";
  }
  return "object";
}

std::string object_description(const Value& v) {
  return v.is_none() ? "None" : type_name(v) + " object";
}

void require_defined(const Value& v) {
  if (v.is_undefined())
    throw JinjaError(v.undefined_hint().empty() ? "undefined value" : v.undefined_hint());
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.as_bool();
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_float() != 0.0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kList:
      return !v.items().empty();
    case Value::Kind::kDict:
      return !v.dict_data().entries.empty();
    default:
      return true;
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i)
        if (!equals(a.items()[i], b.items()[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      const auto& x = a.dict_data().entries;
      if (x.size() != b.dict_data().entries.size()) return false;
      for (const auto& [k, v] : x) {
        const Value* other = b.dict_data().find(k);
        if (!other || !equals(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.same_object(b);
  }
}

int compare(const Value& a, const Value& b, const char* op) {
  require_defined(a);
  require_defined(b);
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float())
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    return a.as_float() < b.as_float() ? -1 : a.as_float() > b.as_float();
  }
  if (a.is_string() && b.is_string()) return a.as_string().compare(b.as_string());  // code points
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!equals(x[i], y[i])) return compare(x[i], y[i], op);
    return x.size() < y.size() ? -1 : x.size() > y.size();
  }
  throw JinjaError("'" + std::string(op) + "' not supported between instances of '" + type_name(a) +
                   "' and '" + type_name(b) + "'");
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // The shortest round-trip digits, laid out as Python's repr() does: positional notation for
  // decimal exponents in [-4, 16), scientific with a two-digit exponent otherwise.
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);
  const size_t e_at = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e_at; ++i)
    if (sci[i] >= '0' && sci[i] <= '9') digits += sci[i];
  const int exponent = std::stoi(sci.substr(e_at + 1));
  const int decpt = exponent + 1;
  const int n = static_cast<int>(digits.size());
  std::string out = std::signbit(d) ? "-" : "";
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (decpt >= n) {
      out += digits + std::string(static_cast<size_t>(decpt - n), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." +
             digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  return out + exp_text;
}

namespace {

std::string string_repr(const std::string& s) {
  // Python picks single quotes unless the text has one and no double quote.
  const bool has_single = s.find('\'') != std::string::npos;
  const char quote = has_single && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : utf8_decode(s)) {
    char esc[16];
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F || (c >= 0x80 && !py_isprintable(c))) {
      const char* fmt = c <= 0xFF ? "\\x%02x" : c <= 0xFFFF ? "\\u%04x" : "\\U%08x";
      std::snprintf(esc, sizeof(esc), fmt, static_cast<unsigned>(c));
      out += esc;
    } else {
      utf8_append(out, c);
    }
  }
  return out + quote;
}

std::string join_reprs(const std::vector<Value>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + repr(items[i]);
  return out;
}

std::string dict_repr(const DictData& d) {
  std::string out = "{";
  for (size_t i = 0; i < d.entries.size(); ++i)
    out += (i ? ", " : "") + repr(d.entries[i].first) + ": " + repr(d.entries[i].second);
  return out + "}";
}

}  // namespace

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return float_repr(v.as_float());
    case Value::Kind::kString:
      return v.as_string();
    case Value::Kind::kList:
      if (!v.is_tuple()) return "[" + join_reprs(v.items()) + "]";
      return "(" + join_reprs(v.items()) + (v.items().size() == 1 ? ",)" : ")");
    case Value::Kind::kDict:
      return dict_repr(v.dict_data());
    case Value::Kind::kNamespace:
      return "<Namespace " + dict_repr(v.namespace_data()) + ">";
    case Value::Kind::kFunction:
      return "<function " + v.function_data().name + ">";
  }
  return "";
}

std::string repr(const Value& v) {
  if (v.is_string()) return string_repr(v.as_string());
  if (v.is_undefined()) return "Undefined";
  return to_str(v);
}

}  // namespace shardtrain::detail::jinja
