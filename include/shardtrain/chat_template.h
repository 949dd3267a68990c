// Chat templates: the Jinja template of a model's tokenizer_config.json (`chat_template`) that
// turns a conversation into the text the model was trained on, rendered as transformers'
// apply_chat_template(tokenize=False) renders it (trim_blocks, lstrip_blocks, the variables
// messages, add_generation_prompt, bos_token, eos_token and the functions raise_exception,
// strftime_now, namespace). docs/chat_templates.md lists the Jinja the renderer supports; a
// template that uses anything else is refused when it is parsed (a method of str it lacks, when
// the render reaches it), with a message naming the file, the line and the construct. Where
// Python's Jinja and other renderers disagree, this one follows Python, which transformers runs.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace shardtrain {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" (or what the template knows, e.g. "tool")
  std::string content;
};

namespace detail {
class ChatTemplateProgram;
}

class ChatTemplate {
 public:
  // Parses `source` once. `origin` names where it came from in errors (a file path). `bos_token`
  // and `eos_token` are the template's variables of those names; an empty one leaves the variable
  // undefined, as transformers does for a tokenizer without that token. Throws
  // std::invalid_argument "chat template of '<origin>' line N: ..." for a syntax error or an
  // unsupported construct.
  ChatTemplate(const std::string& source, std::string origin, std::string bos_token = "",
               std::string eos_token = "");
  // The template of a model folder or tokenizer_config.json: a chat_template.jinja beside it wins
  // (as in transformers), else tokenizer_config.json's "chat_template" (a string, or the entry
  // named "default" of a list). `path` may also name a .jinja file, read with the
  // tokenizer_config.json beside it when there is one. Every special token of that
  // tokenizer_config.json (bos_token, eos_token, unk_token, pad_token, additional_special_tokens,
  // extra_special_tokens...) becomes a variable, as transformers passes them. Throws
  // std::invalid_argument naming the file when neither has a template, or when the file is
  // missing or not JSON.
  static ChatTemplate from_model_files(const std::string& path);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // The text of the conversation; with `add_generation_prompt`, followed by what opens the
  // assistant's reply. Throws std::invalid_argument with the template's own message when it calls
  // raise_exception (e.g. roles that do not alternate), or naming the line that failed. Const and
  // free of shared state: threads may render with one ChatTemplate at once.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  // The same for messages given as a JSON array (any fields: tool_calls, reasoning_content,
  // content as a list of parts) and extra variables as a JSON object (e.g. {"enable_thinking":
  // false}, {"tools": [...]}). `tools` and `documents` are None unless given, as in transformers.
  // Throws std::invalid_argument for JSON that does not parse or is not an array / object.
  std::string render_json(const std::string& messages_json, bool add_generation_prompt,
                          const std::string& extra_variables_json = "{}") const;

  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  std::unique_ptr<detail::ChatTemplateProgram> program_;
  std::string bos_token_, eos_token_;
};

}  // namespace shardtrain
