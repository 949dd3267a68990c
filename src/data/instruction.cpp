// Instruction data: a conversation through its chat template, or a prompt/completion pair, into
// token ids with the loss flags of what the model learns to write; JSONL files into a sample
// shard.
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string_view>

#include "data/jinja_unicode.h"
#include "data/shard_io.h"
#include "shardtrain/samples.h"

namespace shardtrain {
namespace {

void append(TokenizedSample& sample, const std::vector<int32_t>& ids, bool loss) {
  sample.ids.insert(sample.ids.end(), ids.begin(), ids.end());
  sample.loss.insert(sample.loss.end(), ids.size(), loss ? 1 : 0);
}

// The code point at `at` and its length in bytes; an invalid byte stands for itself.
std::pair<char32_t, size_t> code_point_at(std::string_view text, size_t at) {
  const auto lead = static_cast<unsigned char>(text[at]);
  const size_t length = lead < 0x80       ? 1
                        : lead >> 5 == 6  ? 2
                        : lead >> 4 == 14 ? 3
                        : lead >> 3 == 30 ? 4
                                          : 1;
  if (length == 1 || at + length > text.size()) return {lead, 1};
  const std::u32string decoded = detail::jinja::utf8_decode(text.substr(at, length));
  return {decoded.size() == 1 ? decoded[0] : U'\xFFFD', length};
}

// Without leading (and trailing) whitespace as Python's str.strip() sees it, which Jinja's
// trim filter uses: Unicode spaces and line separators included.
std::string_view left_trimmed(std::string_view text) {
  size_t at = 0;
  while (at < text.size()) {
    const auto [c, length] = code_point_at(text, at);
    if (!detail::jinja::py_isspace(c)) break;
    at += length;
  }
  return text.substr(at);
}

std::string_view trimmed(std::string_view text) {
  text = left_trimmed(text);
  size_t end = 0;  // just past the last code point that is not whitespace
  for (size_t at = 0; at < text.size();) {
    const auto [c, length] = code_point_at(text, at);
    at += length;
    if (!detail::jinja::py_isspace(c)) end = at;
  }
  return text.substr(0, end);
}

// The answer of a reply that carries its reasoning first, "<think>...</think>answer" (Qwen3's
// convention, whose template renders the reasoning apart or drops it): what follows the last
// </think>, its leading whitespace removed. Empty when there is no such block.
std::string_view answer_after_reasoning(std::string_view content) {
  const size_t end = content.rfind("</think>");
  if (end == std::string_view::npos) return {};
  return left_trimmed(content.substr(end + std::string_view("</think>").size()));
}

// Where assistant message `index`'s content lies in `rendered`, searched from `from`: as given,
// without its leading whitespace (Qwen3's template strips leading newlines), trimmed (Llama's
// and Gemma's trim it), or its answer after a reasoning block. Where the rendering of the messages
// before it, followed by the generation prompt, is a prefix of the whole, the search starts after
// that prefix, so that a short reply that also occurs in an earlier user message is not taken for
// the reply.
std::pair<size_t, size_t> find_reply(const std::string& rendered,
                                     const std::vector<ChatMessage>& messages, size_t index,
                                     const ChatTemplate& chat_template, size_t from) {
  const std::vector<ChatMessage> before(messages.begin(), messages.begin() + index);
  if (!before.empty()) {
    const std::string prompt = chat_template.render(before, /*add_generation_prompt=*/true);
    if (rendered.compare(0, prompt.size(), prompt) == 0) from = std::max(from, prompt.size());
  }
  const std::string& content = messages[index].content;
  if (trimmed(content).empty()) return {from, 0};  // nothing to learn: no span, no end of turn
  for (const std::string_view wanted : {std::string_view(content), left_trimmed(content),
                                        trimmed(content), answer_after_reasoning(content)}) {
    if (wanted.empty()) continue;
    const size_t at = rendered.find(wanted, from);
    if (at != std::string::npos) return {at, wanted.size()};
  }
  throw std::invalid_argument("the chat template of '" + chat_template.origin() +
                              "' changes assistant message " + std::to_string(index + 1) +
                              "'s content, so its tokens cannot be found for the loss mask");
}

}  // namespace

DataFormat data_format_from_string(const std::string& name) {
  if (name == "text") return DataFormat::kText;
  if (name == "chat") return DataFormat::kChat;
  if (name == "prompt_completion") return DataFormat::kPromptCompletion;
  throw std::invalid_argument(
      "data.format must be \"text\", \"chat\" or \"prompt_completion\", got \"" + name + "\"");
}

std::string to_string(DataFormat format) {
  switch (format) {
    case DataFormat::kText:
      return "text";
    case DataFormat::kChat:
      return "chat";
    case DataFormat::kPromptCompletion:
      return "prompt_completion";
  }
  return "unknown";
}

TokenizedSample tokenize_chat(const std::vector<ChatMessage>& messages,
                              const ChatTemplate& chat_template, const Tokenizer& tokenizer) {
  const std::string rendered = chat_template.render(messages, /*add_generation_prompt=*/false);
  TokenizedSample sample;
  size_t cursor = 0;
  bool after_reply = false;
  // The prompt piece before a reply, then the reply; the first token after a reply carries the
  // loss too when it is the special token that ends the turn.
  auto add_prompt = [&](std::string_view text) {
    const size_t first = sample.ids.size();
    append(sample, tokenizer.encode(std::string(text)), false);
    if (after_reply && sample.ids.size() > first && tokenizer.is_special(sample.ids[first])) {
      sample.loss[first] = 1;
    }
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    const auto [at, length] = find_reply(rendered, messages, i, chat_template, cursor);
    if (length == 0) continue;
    add_prompt(std::string_view(rendered).substr(cursor, at - cursor));
    append(sample, tokenizer.encode(rendered.substr(at, length)), true);
    cursor = at + length;
    after_reply = true;
  }
  add_prompt(std::string_view(rendered).substr(cursor));
  return sample;
}

TokenizedSample tokenize_prompt_completion(const std::string& prompt, const std::string& completion,
                                           const Tokenizer& tokenizer) {
  TokenizedSample sample;
  append(sample, tokenizer.encode(prompt, /*add_special=*/true), false);
  append(sample, tokenizer.encode(completion), true);
  append(sample, {tokenizer.eos_id()}, true);
  return sample;
}

namespace {

std::string string_key(const nlohmann::json& object, const char* key, const std::string& where) {
  if (!object.is_object() || !object.contains(key) || !object.at(key).is_string()) {
    throw std::invalid_argument(where + " has no string \"" + key + "\"");
  }
  return object.at(key).get<std::string>();
}

std::vector<ChatMessage> chat_messages(const nlohmann::json& line, const std::string& where) {
  if (!line.is_object() || !line.contains("messages") || !line.at("messages").is_array()) {
    throw std::invalid_argument(where +
                                " has no \"messages\" array (data.format \"chat\" reads "
                                "{\"messages\": [{\"role\": ..., \"content\": ...}, ...]})");
  }
  std::vector<ChatMessage> messages;
  for (const auto& message : line.at("messages")) {
    const std::string at = where + ", message " + std::to_string(messages.size() + 1) + ",";
    messages.push_back({string_key(message, "role", at), string_key(message, "content", at)});
  }
  if (messages.empty()) throw std::invalid_argument(where + " has no messages");
  return messages;
}

TokenizedSample tokenize_line(const std::string& text, const std::string& where, DataFormat format,
                              const Tokenizer& tokenizer, const ChatTemplate* chat_template) {
  nlohmann::json line;
  try {
    line = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw std::invalid_argument(where + " is not JSON (" + e.what() + ")");
  }
  if (format == DataFormat::kPromptCompletion) {
    const std::string prompt = string_key(line, "prompt", where);  // named first when both lack
    return tokenize_prompt_completion(prompt, string_key(line, "completion", where), tokenizer);
  }
  const std::vector<ChatMessage> messages = chat_messages(line, where);
  try {
    return tokenize_chat(messages, *chat_template, tokenizer);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(where + ": " + e.what());
  }
}

}  // namespace

TokenizedSamples tokenize_samples(const std::vector<std::string>& inputs, DataFormat format,
                                  const Tokenizer& tokenizer, const ChatTemplate* chat_template) {
  if (format == DataFormat::kText) {
    throw std::invalid_argument("tokenize_samples: data.format \"text\" makes a token shard");
  }
  if (format == DataFormat::kChat && !chat_template) {
    throw std::invalid_argument("data.format \"chat\" needs a chat template (data.chat_template)");
  }
  if (inputs.empty()) throw std::invalid_argument("data.corpus is not set (JSONL files)");
  const std::vector<std::string> files = detail::files_of(inputs, "data.corpus");
  if (files.empty()) throw std::invalid_argument("data.corpus names no file");
  TokenizedSamples out;
  out.offsets = {0};
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw std::invalid_argument("data file '" + file + "' cannot be read");
    std::string text;
    for (int64_t number = 1; std::getline(in, text); ++number) {
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = "'" + file + "' line " + std::to_string(number);
      const TokenizedSample sample = tokenize_line(text, where, format, tokenizer, chat_template);
      out.tokens.insert(out.tokens.end(), sample.ids.begin(), sample.ids.end());
      out.loss.insert(out.loss.end(), sample.loss.begin(), sample.loss.end());
      out.offsets.push_back(static_cast<int64_t>(out.tokens.size()));
      for (const uint8_t flag : sample.loss) out.stats.loss_tokens += flag;
    }
  }
  out.stats.samples = static_cast<int64_t>(out.offsets.size()) - 1;
  out.stats.tokens = static_cast<int64_t>(out.tokens.size());
  if (out.stats.loss_tokens == 0) {
    throw std::invalid_argument(
        "no token of data.corpus ('" + files.front() + "'" +
        (files.size() > 1 ? " and " + std::to_string(files.size() - 1) + " more" : "") + ", " +
        std::to_string(out.stats.samples) + " samples) carries a loss: every token is masked " +
        (format == DataFormat::kChat ? "(chat samples need assistant messages with content)"
                                     : "(every completion is empty)"));
  }
  return out;
}

SampleStats prepare_sample_shard(const std::vector<std::string>& inputs, DataFormat format,
                                 const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                                 const std::string& out_path) {
  detail::check_output_is_not_input(inputs, out_path);
  const TokenizedSamples samples = tokenize_samples(inputs, format, tokenizer, chat_template);
  write_sample_shard(out_path, samples.tokens, samples.loss, samples.offsets,
                     tokenizer.vocab_size());
  return samples.stats;
}

}  // namespace shardtrain
