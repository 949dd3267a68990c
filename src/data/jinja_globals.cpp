// The functions every template can call: Jinja's range, dict and namespace, and the two that
// transformers adds, raise_exception and strftime_now.
#include <ctime>

#include "data/jinja_eval.h"
#include "data/jinja_filters.h"

namespace shardtrain::detail::jinja {
namespace {

// Jinja's sandbox refuses larger ranges (MAX_RANGE); so does this, with the same limit.
constexpr int64_t kMaxRange = 100000;

Value range(const CallArgs& args) {
  if (!args.keyword.empty()) throw JinjaError("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3)
    throw JinjaError("range expected 1 to 3 arguments, got " + std::to_string(p.size()));
  for (const Value& v : p)
    if (!v.is_int() && !v.is_bool())
      throw JinjaError("'" + type_name(v) + "' object cannot be interpreted as an integer");
  const int64_t start = p.size() == 1 ? 0 : p[0].as_int();
  const int64_t stop = p.size() == 1 ? p[0].as_int() : p[1].as_int();
  const int64_t step = p.size() == 3 ? p[2].as_int() : 1;
  if (step == 0) throw JinjaError("range() arg 3 must not be zero");
  std::vector<Value> items;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(items.size()) >= kMaxRange)
      throw JinjaError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    items.push_back(Value::integer(i));
  }
  return Value::list(std::move(items));
}

// dict(mapping or pairs, **kwargs): the entries namespace() and dict() start from.
DictData entries_of(const std::string& what, const CallArgs& args) {
  if (args.positional.size() > 1)
    throw JinjaError(what + " expected at most 1 argument, got " +
                     std::to_string(args.positional.size()));
  DictData d;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      d = source.dict_data();
    } else if (source.is_list()) {
      for (const Value& pair : source.items()) {
        if (!pair.is_list() || pair.items().size() != 2)
          throw JinjaError(what + ": each element must be a key and a value");
        d.set(pair.items()[0], pair.items()[1]);
      }
    } else {
      throw JinjaError("'" + type_name(source) + "' object is not iterable");
    }
  }
  for (const auto& [key, value] : args.keyword) d.set(Value::str(key), value);
  return d;
}

std::string strftime_now(const std::string& format) {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  if (format.empty()) return "";
  // strftime reports 0 both for "buffer too small" and for an empty result; grow until it fits.
  for (size_t size = 256; size <= 65536; size *= 4) {
    std::string buf(size, '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &local);
    if (n > 0) return buf.substr(0, n);
  }
  return "";
}

Value refused(const std::string& name) {
  return Value::function(name, [name](const CallArgs&) -> Value { unsupported(name + "()"); });
}

}  // namespace

Variables builtin_globals() {
  Variables globals;
  globals.emplace_back("range", Value::function("range", range));
  globals.emplace_back("dict", Value::function("dict", [](const CallArgs& args) {
                         return Value::dict(entries_of("dict", args));
                       }));
  globals.emplace_back("namespace", Value::function("namespace", [](const CallArgs& args) {
                         return Value::namespace_(entries_of("namespace", args));
                       }));
  globals.emplace_back("raise_exception",
                       Value::function("raise_exception", [](const CallArgs& args) -> Value {
                         const auto a = bind_args("raise_exception", args, {"message"});
                         throw JinjaError(given(a[0]) ? to_str(a[0]) : "", 0, true);
                       }));
  globals.emplace_back("strftime_now", Value::function("strftime_now", [](const CallArgs& args) {
                         const auto a = bind_args("strftime_now", args, {"format"});
                         if (!given(a[0]) || !a[0].is_string())
                           throw JinjaError("strftime_now() needs a format string");
                         return Value::str(strftime_now(a[0].as_string()));
                       }));
  for (const char* name : {"cycler", "joiner", "lipsum"}) globals.emplace_back(name, refused(name));
  return globals;
}

}  // namespace shardtrain::detail::jinja
