// JSON to values and values to Python's json.dumps text; see jinja_json.h.
#include "data/jinja_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "data/jinja_unicode.h"

namespace shardtrain::detail::jinja {

Value from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      if (json.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        unsupported("the integer " + json.dump() + " (beyond 64 bits)");
      return Value::integer(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value::real(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::str(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      DictData d;
      d.entries.reserve(json.size());
      for (const auto& [key, item] : json.items())
        d.entries.emplace_back(Value::str(key), from_json(item));
      return Value::dict(std::move(d));
    }
    default:
      unsupported("binary JSON values");
  }
}

namespace {

// json.dumps's string escaping: quotes, backslashes and control characters always; with
// ensure_ascii everything outside printable ASCII as \uXXXX (surrogate pairs above U+FFFF).
void append_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  char buf[16];
  for (char32_t c : utf8_decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      utf8_append(out, c);
    }
  }
  out += '"';
}

std::string float_json(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return float_repr(d);
}

std::string key_text(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString:
      return key.as_string();
    case Value::Kind::kBool:
      return key.as_bool() ? "true" : "false";
    case Value::Kind::kNone:
      return "null";
    case Value::Kind::kInt:
      return std::to_string(key.as_int());
    case Value::Kind::kFloat:
      return float_json(key.as_float());
    default:
      throw JinjaError("keys must be str, int, float, bool or None, not " + type_name(key));
  }
}

class Encoder {
 public:
  explicit Encoder(const JsonOptions& options) : opt_(options) {
    item_sep_ = options.separators_set ? options.item_separator : options.indent_set ? "," : ", ";
    key_sep_ = options.separators_set ? options.key_separator : ": ";
  }

  void encode(const Value& v, int level, std::string& out) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat:
        out += float_json(v.as_float());
        return;
      case Value::Kind::kString:
        append_string(out, v.as_string(), opt_.ensure_ascii);
        return;
      case Value::Kind::kList: {
        if (v.items().empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < v.items().size(); ++i) {
          if (i) out += item_sep_;
          newline(level + 1, out);
          encode(v.items()[i], level + 1, out);
        }
        newline(level, out);
        out += ']';
        return;
      }
      case Value::Kind::kDict: {
        auto entries = v.dict_data().entries;
        if (entries.empty()) {
          out += "{}";
          return;
        }
        if (opt_.sort_keys)
          std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
            return compare(a.first, b.first, "<") < 0;
          });
        out += '{';
        for (size_t i = 0; i < entries.size(); ++i) {
          if (i) out += item_sep_;
          newline(level + 1, out);
          append_string(out, key_text(entries[i].first), opt_.ensure_ascii);
          out += key_sep_;
          encode(entries[i].second, level + 1, out);
        }
        newline(level, out);
        out += '}';
        return;
      }
      default:
        throw JinjaError("Object of type " + type_name(v) + " is not JSON serializable");
    }
  }

 private:
  void newline(int level, std::string& out) const {
    if (!opt_.indent_set) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += opt_.indent;
  }

  const JsonOptions& opt_;
  std::string item_sep_, key_sep_;
};

}  // namespace

std::string to_json(const Value& value, const JsonOptions& options) {
  std::string out;
  Encoder(options).encode(value, 0, out);
  return out;
}

}  // namespace shardtrain::detail::jinja
