// The readers of training data and of a model's own text files: a sample shard, instruction
// JSONL, a chat template's Jinja, a Hugging Face tokenizer.json.
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#include "fuzz_target.h"
#include "shardtrain/chat_template.h"
#include "shardtrain/hf_tokenizer.h"
#include "shardtrain/samples.h"

namespace shardtrain::fuzz {
namespace {

// A template that reads each message and closes every turn, for the JSONL target.
const char* kTemplate =
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

}  // namespace

int sample_shard(const uint8_t* data, size_t size) {
  try {
    const SampleShard shard(input_file("input.samples", data, size));
    for (int64_t i = 0; i < std::min<int64_t>(shard.num_samples(), 8); ++i) {
      std::vector<int64_t> ids(static_cast<size_t>(shard.length(i)));
      std::vector<uint8_t> loss(ids.size());
      shard.read(i, 0, shard.length(i), ids.data(), loss.data());
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

// The first byte picks the format; the rest is the JSONL file.
int instruction_jsonl(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::unique_ptr<Tokenizer> bytes = make_byte_tokenizer();
  static const ChatTemplate chat(kTemplate, "fuzz template");
  const DataFormat format = data[0] % 2 ? DataFormat::kChat : DataFormat::kPromptCompletion;
  try {
    tokenize_samples({input_file("input.jsonl", data + 1, size - 1)}, format, *bytes, &chat);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

// The input is a template; it renders a fixed conversation, with and without the generation
// prompt.
int chat_template(const uint8_t* data, size_t size) {
  try {
    const ChatTemplate chat(std::string(reinterpret_cast<const char*>(data), size), "fuzz template",
                            "<s>", "</s>");
    const std::vector<ChatMessage> messages = {
        {"system", "Be brief."}, {"user", "Hi\n"}, {"assistant", " Hello! "}, {"user", "ok"}};
    chat.render(messages, false);
    chat.render(messages, true);
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

int hf_tokenizer(const uint8_t* data, size_t size) {
  try {
    const auto tokenizer = load_hf_tokenizer(input_file("tokenizer.json", data, size));
    for (const std::string text : {"Hello, world!", "  ümlaut 123 😀\n\t", "\xff\xfe bad"}) {
      tokenizer->decode(tokenizer->encode(text, true));
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}

}  // namespace shardtrain::fuzz
