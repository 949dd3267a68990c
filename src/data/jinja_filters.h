// Jinja's filters and tests as transformers' environment has them (its own tojson included), and
// the methods of str, dict and list that templates call (`content.split('</think>')`,
// `message.get('tool_calls')`), all with Python's semantics.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string>
#include <vector>

#include "data/jinja_value.h"

namespace shardtrain::detail::jinja {

enum class Support {
  kSupported,
  kUnsupported,  // a Jinja builtin this interpreter does not implement
  kUnknown,      // not a Jinja builtin either
};
Support filter_support(const std::string& name);
Support test_support(const std::string& name);

// `subject | name(args)`. Throws JinjaError for bad arguments or operand types.
Value apply_filter(const std::string& name, const Value& subject, const CallArgs& args);
// The sequence filters (map, select..., sort, unique, min, max, dictsort, join, sum), which
// apply_filter hands on; in jinja_filters_seq.cpp.
Value apply_sequence_filter(const std::string& name, const Value& subject, const CallArgs& args);
// `subject is name(args)`.
bool apply_test(const std::string& name, const Value& subject, const CallArgs& args);

// `object.name` as Jinja's sandbox reads it: a method of str, dict or list (bound to `object`),
// else the dict's item or namespace's attribute, else undefined. Throws "not supported" for a
// real Python str method this interpreter lacks. A method that mutates (append, update...) is
// an undefined that fails when called, as in transformers' immutable sandbox.
Value get_attribute(const Value& object, const std::string& name);
// `object[key]`: the item, else (for a string key) the attribute, else undefined.
Value get_item(const Value& object, const Value& key);
// `object[start:stop:step]` of a list, tuple or string; null pointers are omitted bounds.
Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step);

// Binds a call's arguments to `names` as Python would (positional first, then by keyword):
// the result has one slot per name, undefined-with-hint "<missing>" for those not given. Throws
// for an unexpected keyword or too many positional arguments; `what` names the callee.
std::vector<Value> bind_args(const std::string& what, const CallArgs& args,
                             std::initializer_list<const char*> names);
bool given(const Value& slot);  // whether bind_args found an argument for this slot
// The string argument `v`, or JinjaError "<what> must be a string, not int".
std::string need_string(const Value& v, const std::string& what);
// The integer (or bool) argument `v`, or JinjaError "<what> must be an integer, not str".
int64_t need_int(const Value& v, const std::string& what);

// Whether `name` is one of `names`.
template <size_t N>
bool listed(const char* const (&names)[N], const std::string& name) {
  return std::any_of(std::begin(names), std::end(names), [&](const char* n) { return name == n; });
}

}  // namespace shardtrain::detail::jinja
