// ChatTemplate: a model's Jinja chat template, parsed once, rendered with the variables
// transformers' apply_chat_template passes.
#include "shardtrain/chat_template.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>

#include "data/bpe.h"
#include "data/jinja_eval.h"
#include "data/jinja_json.h"
#include "data/jinja_parser.h"

namespace shardtrain {
namespace detail {

class ChatTemplateProgram {
 public:
  jinja::Program program;
  // The tokenizer's other special tokens (unk_token, pad_token, additional_special_tokens...),
  // which transformers passes to every render; empty for a template given as text.
  jinja::Variables special_tokens;
};

}  // namespace detail

namespace {

namespace fs = std::filesystem;
using detail::jinja::JinjaError;
using detail::jinja::Value;

std::invalid_argument template_error(const std::string& origin, const JinjaError& e) {
  std::string where = "chat template of '" + origin + "'";
  if (e.line > 0) where += " line " + std::to_string(e.line);
  return std::invalid_argument(where + (e.raised ? " raised an exception: " : ": ") + e.what());
}

// A special token in tokenizer_config.json: a string, or an AddedToken object with "content".
std::optional<std::string> token_text(const nlohmann::ordered_json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return std::nullopt;
}

// transformers' special_tokens_map: the named special tokens that are set, the additional ones
// as a list, and a tokenizer's extra_special_tokens (Gemma 3's image tokens) by their own names.
detail::jinja::Variables special_tokens_of(const nlohmann::ordered_json& config) {
  detail::jinja::Variables vars;
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                           "cls_token", "mask_token"}) {
    if (!config.contains(name)) continue;
    if (auto text = token_text(config[name])) vars.emplace_back(name, Value::str(*text));
  }
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    std::vector<Value> tokens;
    for (const auto& t : config["additional_special_tokens"])
      if (auto text = token_text(t)) tokens.push_back(Value::str(*text));
    vars.emplace_back("additional_special_tokens", Value::list(std::move(tokens)));
  }
  if (config.contains("extra_special_tokens") && config["extra_special_tokens"].is_object()) {
    for (const auto& [name, t] : config["extra_special_tokens"].items())
      if (auto text = token_text(t)) vars.emplace_back(name, Value::str(*text));
  }
  return vars;
}

nlohmann::ordered_json parse_json(const std::string& text, const std::string& what) {
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(what + " is not valid JSON: " + e.what());
  }
}

// tokenizer_config.json's "chat_template": a string, or named templates (e.g. "default",
// "tool_use") of which apply_chat_template takes "default".
std::string template_of_config(const nlohmann::ordered_json& config, const std::string& origin) {
  const auto found = config.find("chat_template");
  if (found == config.end() || found->is_null())
    throw std::invalid_argument("tokenizer config '" + origin +
                                "' has no chat_template, and there is no chat_template.jinja "
                                "beside it");
  if (found->is_string()) return found->get<std::string>();
  if (found->is_array()) {
    std::string names;
    for (const auto& entry : *found) {
      if (!entry.is_object() || !entry.contains("name")) continue;
      if (entry["name"] == "default" && entry.contains("template") && entry["template"].is_string())
        return entry["template"].get<std::string>();
      names += (names.empty() ? "" : ", ") + entry["name"].dump();
    }
    throw std::invalid_argument("tokenizer config '" + origin + "' has chat templates " + names +
                                " but none named \"default\" (with a string template)");
  }
  throw std::invalid_argument("tokenizer config '" + origin +
                              "': chat_template must be a string or a list of {name, template}, "
                              "not " +
                              std::string(found->type_name()));
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, std::string origin, std::string bos_token,
                           std::string eos_token)
    : origin_(std::move(origin)),
      program_(std::make_unique<detail::ChatTemplateProgram>()),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)) {
  try {
    program_->program = detail::jinja::parse(source);
  } catch (const JinjaError& e) {
    throw template_error(origin_, e);
  }
}

ChatTemplate ChatTemplate::from_model_files(const std::string& path) {
  const fs::path given(path);
  // A .jinja file names the template itself; otherwise a folder or its tokenizer_config.json.
  const bool jinja_given = given.extension() == ".jinja" && !fs::is_directory(given);
  const fs::path config_path = fs::is_directory(given) ? given / "tokenizer_config.json"
                               : jinja_given ? given.parent_path() / "tokenizer_config.json"
                                             : given;
  const fs::path jinja_path =
      jinja_given ? given : config_path.parent_path() / "chat_template.jinja";
  // Without a tokenizer_config.json a .jinja template still renders, with no special tokens.
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (fs::exists(config_path) || !fs::exists(jinja_path)) {
    config = parse_json(detail::read_whole_file(config_path.string(), "tokenizer config"),
                        "tokenizer config '" + config_path.string() + "'");
    if (!config.is_object())
      throw std::invalid_argument("tokenizer config '" + config_path.string() +
                                  "' is not a JSON object");
  }
  const bool from_jinja = jinja_given || fs::exists(jinja_path);
  const std::string origin = from_jinja ? jinja_path.string() : config_path.string();
  const std::string source = from_jinja ? detail::read_whole_file(origin, "chat template")
                                        : template_of_config(config, origin);
  detail::jinja::Variables tokens = special_tokens_of(config);
  auto take = [&](const char* name) {
    for (const auto& token : tokens)
      if (token.first == name) return token.second.as_string();
    return std::string();
  };
  ChatTemplate result(source, origin, take("bos_token"), take("eos_token"));
  result.program_->special_tokens = std::move(tokens);
  return result;
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) const {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  return render_json(list.dump(), add_generation_prompt);
}

std::string ChatTemplate::render_json(const std::string& messages_json, bool add_generation_prompt,
                                      const std::string& extra_variables_json) const {
  const auto messages = parse_json(messages_json, "chat messages");
  if (!messages.is_array())
    throw std::invalid_argument("chat messages must be a JSON array, not " +
                                std::string(messages.type_name()));
  const auto extra = parse_json(extra_variables_json, "chat template variables");
  if (!extra.is_object())
    throw std::invalid_argument("chat template variables must be a JSON object, not " +
                                std::string(extra.type_name()));
  try {
    // In the order transformers builds them: tools and documents (None unless given), the
    // tokenizer's special tokens, the caller's variables; messages and add_generation_prompt last.
    detail::jinja::Variables vars = {{"tools", Value::none()}, {"documents", Value::none()}};
    for (const auto& v : program_->special_tokens) vars.push_back(v);
    if (!bos_token_.empty()) vars.emplace_back("bos_token", Value::str(bos_token_));
    if (!eos_token_.empty()) vars.emplace_back("eos_token", Value::str(eos_token_));
    for (const auto& [name, value] : extra.items()) {
      if (name == "messages" || name == "add_generation_prompt")
        throw std::invalid_argument("chat template variables must not set '" + name +
                                    "' (it is an argument of render)");
      vars.emplace_back(name, detail::jinja::from_json(value));
    }
    vars.emplace_back("messages", detail::jinja::from_json(messages));
    vars.emplace_back("add_generation_prompt", Value::boolean(add_generation_prompt));
    return detail::jinja::render(program_->program, vars);
  } catch (const JinjaError& e) {
    throw template_error(origin_, e);
  }
}

}  // namespace shardtrain
