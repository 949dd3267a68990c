// JSON in and out of template values: the messages and variables a caller passes arrive as JSON,
// and the tojson filter writes JSON as transformers' override of it does (Python's json.dumps
// with ensure_ascii=False), so tool schemas appear in the prompt byte for byte as in training.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "data/jinja_value.h"

namespace shardtrain::detail::jinja {

// Objects keep their key order (nlohmann's ordered_json), as Python's json.loads does.
Value from_json(const nlohmann::ordered_json& json);

struct JsonOptions {
  bool ensure_ascii = false;
  bool indent_set = false;
  std::string indent;  // the text of one level
  bool separators_set = false;
  std::string item_separator = ", ", key_separator = ": ";
  bool sort_keys = false;
};
// json.dumps(value, ensure_ascii, indent, separators, sort_keys). Throws JinjaError for what
// Python cannot serialize (undefined, a namespace, a function, a tuple as a key).
std::string to_json(const Value& value, const JsonOptions& options);

}  // namespace shardtrain::detail::jinja
