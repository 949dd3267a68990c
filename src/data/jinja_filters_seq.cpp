// The filters over sequences: map, select and reject (by item or attribute), sort, unique, min,
// max, dictsort, join and sum. Jinja returns generators from some of them; here they are lists,
// which print differently (`{{ xs|map(...) }}` prints a generator object in Python) but iterate,
// join and count the same.
#include <algorithm>
#include <charconv>

#include "data/jinja_eval.h"
#include "data/jinja_filters.h"
#include "data/jinja_unicode.h"

namespace shardtrain::detail::jinja {
namespace {

// Jinja's make_attrgetter: "a.b.0" walks items and attributes; an integer is an index.
Value attribute_path(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return get_item(item, attribute);
  Value current = item;
  const std::string& path = attribute.as_string();
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    require_defined(current);
    // A part of digits is an index (one past 64 bits indexes nothing: a key, as Jinja's would).
    long long index = 0;
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit) &&
        std::from_chars(part.data(), part.data() + part.size(), index).ec == std::errc();
    current = get_item(current, digits ? Value::integer(index) : Value::str(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// The key sort, unique, min and max compare: the attribute(s) named, strings lowercased unless
// case_sensitive. "a,b" compares by a, then b.
Value sort_key(const Value& item, const Value& attribute, bool case_sensitive) {
  auto fold = [&](Value v) {
    return !case_sensitive && v.is_string() ? Value::str(py_lower(v.as_string())) : v;
  };
  if (!given(attribute) || attribute.is_none()) return fold(item);
  if (attribute.is_string() && attribute.as_string().find(',') != std::string::npos) {
    std::vector<Value> parts;
    for (const std::string& a : py_split(attribute.as_string(), std::string(","), -1))
      parts.push_back(fold(attribute_path(item, Value::str(a))));
    return Value::list(std::move(parts));
  }
  return fold(attribute_path(item, attribute));
}

// select / reject / selectattr / rejectattr: keep the items whose test (or truthiness) agrees.
Value filter_select(const std::string& name, const Value& v, const CallArgs& args) {
  const bool by_attribute = name == "selectattr" || name == "rejectattr";
  const bool keep_if = name == "select" || name == "selectattr";
  size_t off = 0;
  Value attribute;
  if (by_attribute) {
    if (args.positional.empty()) throw JinjaError(name + " is missing the attribute name");
    attribute = args.positional[0];
    off = 1;
  }
  std::string test;
  CallArgs test_args;
  if (args.positional.size() > off) {
    test = need_string(args.positional[off], name + "'s test name");
    if (test_support(test) != Support::kSupported) unsupported("the test '" + test + "'");
    test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(off + 1),
                                args.positional.end());
    test_args.keyword = args.keyword;
  }
  std::vector<Value> out;
  for (const Value& item : iterate(v)) {
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    const bool pass = test.empty() ? truthy(subject) : apply_test(test, subject, test_args);
    if (pass == keep_if) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value filter_map(const Value& v, const CallArgs& args) {
  std::vector<Value> out;
  if (args.positional.empty()) {
    const std::vector<Value> a = bind_args("map", args, {"attribute", "default"});
    if (!given(a[0])) throw JinjaError("map needs a filter name or attribute=");
    for (const Value& item : iterate(v)) {
      Value mapped = attribute_path(item, a[0]);
      if (mapped.is_undefined() && given(a[1]) && !a[1].is_none()) mapped = a[1];
      out.push_back(std::move(mapped));
    }
    return Value::list(std::move(out));
  }
  const std::string filter = need_string(args.positional[0], "map's filter name");
  if (filter_support(filter) != Support::kSupported) unsupported("the filter '" + filter + "'");
  CallArgs rest{{args.positional.begin() + 1, args.positional.end()}, args.keyword};
  for (const Value& item : iterate(v)) out.push_back(apply_filter(filter, item, rest));
  return Value::list(std::move(out));
}

Value filter_sort(const std::string& name, const Value& v, const CallArgs& args) {
  std::vector<Value> items = iterate(v);
  if (name == "sort") {
    const auto a = bind_args("sort", args, {"reverse", "case_sensitive", "attribute"});
    const bool reverse = given(a[0]) && truthy(a[0]), cs = given(a[1]) && truthy(a[1]);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value kx = sort_key(x, a[2], cs), ky = sort_key(y, a[2], cs);
      return reverse ? compare(ky, kx, "<") < 0 : compare(kx, ky, "<") < 0;
    });
    return Value::list(std::move(items));
  }
  if (name == "unique") {
    const auto a = bind_args("unique", args, {"case_sensitive", "attribute"});
    std::vector<Value> out, seen;
    for (const Value& item : items) {
      const Value key = sort_key(item, a[1], given(a[0]) && truthy(a[0]));
      if ((key.is_list() && !key.is_tuple()) || key.is_dict() || key.is_namespace())
        throw JinjaError("unhashable type: '" + type_name(key) + "'");  // Python keeps a set
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); }))
        seen.push_back(key), out.push_back(item);
    }
    return Value::list(std::move(out));
  }
  // min / max: the first extreme item.
  const auto a = bind_args(name, args, {"case_sensitive", "attribute"});
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const bool cs = given(a[0]) && truthy(a[0]);
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = compare(sort_key(items[i], a[1], cs), sort_key(items[best], a[1], cs), "<");
    if (name == "min" ? c < 0 : c > 0) best = i;
  }
  return items[best];
}

Value filter_dictsort(const Value& v, const CallArgs& args) {
  const auto a = bind_args("dictsort", args, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) throw JinjaError("dictsort needs a mapping, not " + type_name(v));
  const std::string by = given(a[1]) ? need_string(a[1], "dictsort's by") : "key";
  if (by != "key" && by != "value")
    throw JinjaError("dictsort can only sort by \"key\" or \"value\"");
  const size_t pos = by == "key" ? 0 : 1;
  const bool cs = given(a[0]) && truthy(a[0]), reverse = given(a[2]) && truthy(a[2]);
  std::vector<Value> pairs;
  for (const auto& [k, val] : v.dict_data().entries) pairs.push_back(Value::list({k, val}, true));
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    const Value kx = sort_key(x.items()[pos], Value(), cs),
                ky = sort_key(y.items()[pos], Value(), cs);
    return reverse ? compare(ky, kx, "<") < 0 : compare(kx, ky, "<") < 0;
  });
  return Value::list(std::move(pairs));
}

}  // namespace

Value apply_sequence_filter(const std::string& name, const Value& v, const CallArgs& args) {
  // Jinja's map, select and the like start with `if value:`, so any falsy operand gives nothing.
  const bool mapping = name == "map" || name == "select" || name == "reject" ||
                       name == "selectattr" || name == "rejectattr";
  if (mapping && !truthy(v)) return Value::list({});
  auto bind = [&](std::initializer_list<const char*> names) {
    return bind_args(name, args, names);
  };
  if (name == "join") {
    const auto a = bind({"d", "attribute"});
    const std::string sep = given(a[0]) ? to_str(a[0]) : "";
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      out += (first ? "" : sep) +
             to_str(given(a[1]) && !a[1].is_none() ? attribute_path(item, a[1]) : item);
      first = false;
    }
    return Value::str(std::move(out));
  }
  if (name == "sum") {
    const auto a = bind({"attribute", "start"});
    Value total = given(a[1]) ? a[1] : Value::integer(0);
    for (const Value& item : iterate(v))
      total =
          binary_op("+", total, given(a[0]) && !a[0].is_none() ? attribute_path(item, a[0]) : item);
    return total;
  }
  if (name == "map") return filter_map(v, args);
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
    return filter_select(name, v, args);
  if (name == "sort" || name == "unique" || name == "min" || name == "max")
    return filter_sort(name, v, args);
  if (name == "dictsort") return filter_dictsort(v, args);
  unsupported("the filter '" + name + "'");
}

}  // namespace shardtrain::detail::jinja
