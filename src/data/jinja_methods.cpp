// Attribute, item and slice access as Jinja's sandbox does them, the methods of str, dict and
// list that templates call, and the global functions.
#include <algorithm>

#include "data/jinja_eval.h"
#include "data/jinja_filters.h"
#include "data/jinja_unicode.h"

namespace shardtrain::detail::jinja {
namespace {

// Every method of Python's str: the ones not implemented below are refused rather than read as
// undefined, which would silently render something else than Python.
constexpr const char* kStrMethods[] = {
    "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
    "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
    "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
    "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
    "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
    "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
    "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
    "swapcase",     "title",       "translate", "upper",      "zfill"};
// Methods that mutate: transformers' ImmutableSandboxedEnvironment makes them unsafe.
constexpr const char* kMutators[] = {"append",     "clear",   "extend", "insert",
                                     "pop",        "popitem", "remove", "reverse",
                                     "setdefault", "sort",    "update"};

std::optional<std::string> optional_text(const Value& slot, const std::string& what) {
  if (!given(slot) || slot.is_none()) return std::nullopt;
  if (!slot.is_string())
    throw JinjaError(what + " arg must be None or str, not " + type_name(slot));
  return slot.as_string();
}

bool all_chars(const std::string& s, bool (*pred)(char32_t)) {
  const std::u32string cps = utf8_decode(s);
  return !cps.empty() && std::all_of(cps.begin(), cps.end(), pred);
}

bool affix_matches(const std::string& s, const Value& affix, bool prefix, const std::string& what) {
  auto one = [&](const Value& a) {
    if (!a.is_string())
      throw JinjaError(what + " arg must be str or a tuple of str, not " + type_name(a));
    const std::string& t = a.as_string();
    return t.size() <= s.size() && (prefix ? s.compare(0, t.size(), t) == 0
                                           : s.compare(s.size() - t.size(), t.size(), t) == 0);
  };
  if (affix.is_tuple()) return std::any_of(affix.items().begin(), affix.items().end(), one);
  return one(affix);
}

int64_t code_point_index(const std::string& s, size_t byte_offset) {
  return static_cast<int64_t>(code_point_count(std::string_view(s).substr(0, byte_offset)));
}

Value str_method(const std::string& s, const std::string& name, const CallArgs& args) {
  const std::string what = "str." + name + "()";
  auto bind = [&](std::initializer_list<const char*> names) {
    return bind_args(what, args, names);
  };
  auto required = [&](const Value& slot) {
    if (!given(slot) || !slot.is_string()) throw JinjaError(what + " needs a string argument");
    return slot.as_string();
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const auto a = bind({"chars"});
    return Value::str(py_strip(s, optional_text(a[0], name), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const auto a = bind({"sep", "maxsplit"});
    std::vector<Value> parts;
    for (auto& p : py_split(s, optional_text(a[0], name),
                            given(a[1]) ? need_int(a[1], "maxsplit") : -1, name == "rsplit"))
      parts.push_back(Value::str(std::move(p)));
    return Value::list(std::move(parts));
  }
  if (name == "splitlines") {
    bind({});
    std::vector<Value> parts;
    for (auto& p : py_splitlines(s)) parts.push_back(Value::str(std::move(p)));
    return Value::list(std::move(parts));
  }
  if (name == "startswith" || name == "endswith") {
    const auto a = bind({"prefix"});
    if (!given(a[0])) throw JinjaError(what + " takes at least 1 argument (0 given)");
    return Value::boolean(affix_matches(s, a[0], name == "startswith", name));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& t = required(bind({"affix"})[0]);
    const bool prefix = name == "removeprefix";
    if (!affix_matches(s, Value::str(t), prefix, name)) return Value::str(s);
    return Value::str(prefix ? s.substr(t.size()) : s.substr(0, s.size() - t.size()));
  }
  if (name == "replace") {
    const auto a = bind({"old", "new", "count"});
    return Value::str(
        py_replace(s, required(a[0]), required(a[1]), given(a[2]) ? need_int(a[2], "count") : -1));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "count") {
    const std::string& sub = required(bind({"sub"})[0]);
    if (name == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(code_point_count(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t at = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos && name == "index") throw JinjaError("substring not found");
    return Value::integer(at == std::string::npos ? -1 : code_point_index(s, at));
  }
  if (name == "join") {
    const auto a = bind({"iterable"});
    std::string out;
    bool first = true;
    for (const Value& item : iterate(a[0])) {
      if (!item.is_string())
        throw JinjaError("sequence item: expected str instance, " + type_name(item) + " found");
      out += (first ? "" : s) + item.as_string();
      first = false;
    }
    return Value::str(std::move(out));
  }
  bind({});
  if (name == "upper") return Value::str(py_upper(s));
  if (name == "lower") return Value::str(py_lower(s));
  if (name == "title") return Value::str(py_title(s));
  if (name == "capitalize") return Value::str(py_capitalize(s));
  if (name == "isupper") return Value::boolean(py_isupper(s));
  if (name == "islower") return Value::boolean(py_islower(s));
  if (name == "isspace") return Value::boolean(all_chars(s, py_isspace));
  if (name == "isdigit") return Value::boolean(all_chars(s, py_isdecimal));
  if (name == "isalpha") return Value::boolean(all_chars(s, py_isalpha));
  if (name == "isalnum")
    return Value::boolean(
        all_chars(s, [](char32_t c) { return py_isalpha(c) || py_isnumeric(c); }));
  unsupported("the str method '" + name + "'");
}

bool str_method_implemented(const std::string& name) {
  static const char* const kDone[] = {
      "strip",    "lstrip",       "rstrip",       "split",   "rsplit", "splitlines", "startswith",
      "endswith", "removeprefix", "removesuffix", "replace", "find",   "rfind",      "index",
      "count",    "join",         "upper",        "lower",   "title",  "capitalize", "isupper",
      "islower",  "isspace",      "isdigit",      "isalpha", "isalnum"};
  return listed(kDone, name);
}

Value bound(const Value& self, const std::string& name,
            std::function<Value(const Value&, const CallArgs&)> fn) {
  return Value::function(
      type_name(self) + "." + name,
      [self, fn = std::move(fn)](const CallArgs& args) { return fn(self, args); });
}

}  // namespace

Value get_attribute(const Value& object, const std::string& name) {
  const std::string missing =
      "'" + object_description(object) + "' has no attribute '" + name + "'";
  if (object.is_string()) {
    if (str_method_implemented(name))
      return bound(object, name, [name](const Value& self, const CallArgs& args) {
        return str_method(self.as_string(), name, args);
      });
    if (listed(kStrMethods, name)) unsupported("the str method '" + name + "'");
    return Value::undefined(missing);
  }
  if ((object.is_dict() || object.is_list()) && listed(kMutators, name))
    return Value::undefined("access to attribute '" + name + "' of '" + type_name(object) +
                            "' object is unsafe.");
  if (object.is_dict()) {
    if (name == "items" || name == "keys" || name == "values" || name == "copy")
      return bound(object, name, [name](const Value& self, const CallArgs& args) {
        bind_args("dict." + name + "()", args, {});
        if (name == "copy") return self;
        if (name == "keys") return Value::list(iterate(self));
        std::vector<Value> out;
        for (const auto& [k, v] : self.dict_data().entries)
          out.push_back(name == "values" ? v : Value::list({k, v}, true));
        return Value::list(std::move(out));
      });
    if (name == "get")
      return bound(object, name, [](const Value& self, const CallArgs& args) {
        const auto a = bind_args("dict.get()", args, {"key", "default"});
        const Value* found = self.dict_data().find(a[0]);
        return found ? *found : given(a[1]) ? a[1] : Value::none();
      });
    if (name == "fromkeys") unsupported("the dict method 'fromkeys'");
    const Value* found = object.dict_data().find(Value::str(name));
    return found ? *found : Value::undefined(missing);
  }
  if (object.is_list() && (name == "count" || name == "index" || name == "copy")) {
    return bound(object, name, [name](const Value& self, const CallArgs& args) {
      if (name == "copy") return bind_args("list.copy()", args, {}), self;
      const Value x = bind_args(type_name(self) + "." + name + "()", args, {"value"})[0];
      int64_t count = 0;
      for (size_t i = 0; i < self.items().size(); ++i) {
        if (!equals(self.items()[i], x)) continue;
        if (name == "index") return Value::integer(static_cast<int64_t>(i));
        ++count;
      }
      if (name == "index") throw JinjaError(repr(x) + " is not in list");
      return Value::integer(count);
    });
  }
  if (object.is_namespace()) {
    const Value* found = object.namespace_data().find(Value::str(name));
    if (found) return *found;
  }
  return Value::undefined(missing);
}

Value get_item(const Value& object, const Value& key) {
  if (object.is_dict()) {
    if (const Value* found = object.dict_data().find(key)) return *found;
  } else if ((object.is_list() || object.is_string()) && (key.is_int() || key.is_bool())) {
    const int64_t n = object.is_list() ? static_cast<int64_t>(object.items().size())
                                       : static_cast<int64_t>(code_point_count(object.as_string()));
    const int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
    if (i >= 0 && i < n) {
      if (object.is_list()) return object.items()[static_cast<size_t>(i)];
      std::string ch;
      utf8_append(ch, utf8_decode(object.as_string())[static_cast<size_t>(i)]);
      return Value::str(ch);
    }
    return Value::undefined("'" + object_description(object) + "' has no element " +
                            std::to_string(key.as_int()));
  }
  // Jinja falls back from item to attribute: message['content'] and message.content agree.
  if (key.is_string()) return get_attribute(object, key.as_string());
  return Value::undefined("'" + object_description(object) + "' has no element " + repr(key));
}

Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step) {
  auto index = [](const Value* v, const char* what) -> std::optional<int64_t> {
    if (!v || v->is_none()) return std::nullopt;
    if (!v->is_int() && !v->is_bool())
      throw JinjaError(std::string("slice ") + what + " must be an integer or None, not " +
                       type_name(*v));
    return v->as_int();
  };
  const int64_t s = index(step, "step").value_or(1);
  if (s == 0) throw JinjaError("slice step cannot be zero");
  std::u32string cps;
  if (object.is_string())
    cps = utf8_decode(object.as_string());
  else if (!object.is_list())
    throw JinjaError("'" + type_name(object) + "' object is not subscriptable");
  const int64_t n = object.is_string() ? static_cast<int64_t>(cps.size())
                                       : static_cast<int64_t>(object.items().size());
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v) return fallback;
    int64_t i = *v < 0 ? *v + n : *v;
    if (i < 0) return s < 0 ? int64_t{-1} : int64_t{0};
    return i >= n ? (s < 0 ? n - 1 : n) : i;
  };
  const int64_t first = adjust(index(start, "start"), s < 0 ? n - 1 : 0);
  const int64_t last = adjust(index(stop, "stop"), s < 0 ? -1 : n);
  std::vector<Value> items;
  std::u32string text;
  for (int64_t i = first; s > 0 ? i < last : i > last; i += s) {
    if (object.is_string())
      text += cps[static_cast<size_t>(i)];
    else
      items.push_back(object.items()[static_cast<size_t>(i)]);
  }
  if (object.is_string()) return Value::str(utf8_encode(text));
  return Value::list(std::move(items), object.is_tuple());
}

}  // namespace shardtrain::detail::jinja
