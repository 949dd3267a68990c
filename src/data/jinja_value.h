// The values a chat template computes with, modelled on the Python objects Jinja hands around in
// transformers: None, bool, int, float, str, list, tuple, dict (insertion-ordered), Jinja's
// Undefined and Namespace, and callables. Their semantics (truthiness, ==, ordering, str(), repr())
// are Python's, because the text a model was trained on came out of Python.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace shardtrain::detail::jinja {

// An error while lexing, parsing or rendering. `line` is 0 until the node that failed is known;
// the renderer fills it in on the way out. `raised` marks the template's own raise_exception().
class JinjaError : public std::runtime_error {
 public:
  explicit JinjaError(const std::string& message, int line = 0, bool raised = false)
      : std::runtime_error(message), line(line), raised(raised) {}
  int line;
  bool raised;
};

// "<construct> is not supported": the interpreter refuses rather than guess.
[[noreturn]] void unsupported(const std::string& construct, int line = 0);

class Value;

struct ListData {
  std::vector<Value> items;
  bool tuple = false;  // prints as (a, b) and never equals a list, as in Python
};

// Insertion-ordered like a Python dict. Keys are scalars (str, int, float, bool, None); lookup is
// linear, which beats hashing for the handful of keys a message or a tool schema has.
struct DictData {
  std::vector<std::pair<Value, Value>> entries;
  const Value* find(const Value& key) const;
  void set(Value key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Function {
  std::string name;  // for messages: "macro 'm'", "range", "str.split"
  std::function<Value(const CallArgs&)> call;
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };

  // Undefined by default, with `hint` saying why (Jinja's "'x' is undefined").
  Value() : data_(Undefined{}) {}
  static Value undefined(std::string hint) { return Value(Undefined{std::move(hint)}); }
  static Value none() { return Value(None{}); }
  static Value boolean(bool b) { return Value(b); }
  static Value integer(int64_t i) { return Value(i); }
  static Value real(double d) { return Value(d); }
  static Value str(std::string s) { return Value(std::move(s)); }
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(DictData data);
  static Value namespace_(DictData attrs);
  static Value function(std::string name, std::function<Value(const CallArgs&)> call);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  // int, float or bool: Python's numbers (True + 1 == 2).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }  // list or tuple
  bool is_tuple() const { return is_list() && list_data().tuple; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_function() const { return kind() == Kind::kFunction; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return is_bool() ? as_bool() : std::get<int64_t>(data_); }
  double as_float() const;  // any number
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const std::vector<Value>& items() const { return list_data().items; }
  const ListData& list_data() const { return *std::get<std::shared_ptr<const ListData>>(data_); }
  const DictData& dict_data() const { return *std::get<std::shared_ptr<const DictData>>(data_); }
  // A namespace is the one mutable object: `{% set ns.x = ... %}` is seen by every holder.
  DictData& namespace_data() const { return *std::get<std::shared_ptr<DictData>>(data_); }
  const Function& function_data() const {
    return *std::get<std::shared_ptr<const Function>>(data_);
  }
  const std::string& undefined_hint() const { return std::get<Undefined>(data_).hint; }

  // The same object (Jinja's `sameas`, Python's `is`); scalars compare by value.
  bool same_object(const Value& other) const;

 private:
  struct Undefined {
    std::string hint;
  };
  struct None {};
  using Data = std::variant<Undefined, None, bool, int64_t, double, std::string,
                            std::shared_ptr<const ListData>, std::shared_ptr<const DictData>,
                            std::shared_ptr<DictData>, std::shared_ptr<const Function>>;
  explicit Value(Data data) : data_(std::move(data)) {}
  Data data_;
};

// Python's type names, for messages ("can only concatenate str (not \"int\") to str").
std::string type_name(const Value& v);
// Jinja's object_type_repr: "None", "dict object", "str object"...
std::string object_description(const Value& v);
// Throws Jinja's UndefinedError when `v` is undefined: most operations on it fail in Python.
void require_defined(const Value& v);

bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// <0, 0, >0 for orderable operands (numbers, strings, lists of the same kind); otherwise the
// TypeError Python raises for `op`.
int compare(const Value& a, const Value& b, const char* op);

// Python's str() and repr(); Undefined prints as "".
std::string to_str(const Value& v);
std::string repr(const Value& v);
// Python's repr() of a float: the shortest text that reads back the same, "1.0", "1e+16".
std::string float_repr(double d);

}  // namespace shardtrain::detail::jinja
