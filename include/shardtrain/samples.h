// Instruction data: conversations ({"messages": [...]}) and prompt/completion pairs read from
// JSONL files, tokenized once into a sample shard in which every token carries whether the loss
// is taken on it (the assistant's turns, the completion), and the sample shard itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/chat_template.h"
#include "shardtrain/tokenizer.h"

namespace shardtrain {
namespace detail {
class MappedFile;
}

// data.format: plain text (files, or JSONL {"text": ...} lines: documents trained on whole),
// conversations through the chat template, or prompt/completion pairs.
enum class DataFormat { kText, kChat, kPromptCompletion };
// "text", "chat", "prompt_completion"; throws std::invalid_argument listing them for another.
DataFormat data_format_from_string(const std::string& name);
std::string to_string(DataFormat format);

// One sample's tokens, and for each whether the model learns to produce it (1) or only reads it.
struct TokenizedSample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss;  // as long as ids
};

// A conversation rendered by `chat_template` and tokenized. The loss is taken on each
// assistant message's content and on the special token that closes it (<|im_end|>, <|eot_id|>,
// <end_of_turn>, ...), so that the model learns to end its turn; everything else (system, user,
// the template's markup, earlier turns' headers) is read only. The rendered text is split at the
// assistant contents and each piece tokenized on its own, which gives the ids of the whole text
// wherever a piece boundary is a token boundary (docs/data.md). Throws std::invalid_argument
// when the template raises (roles that do not alternate) or changes an assistant message's
// content so that it cannot be found in the rendered text.
TokenizedSample tokenize_chat(const std::vector<ChatMessage>& messages,
                              const ChatTemplate& chat_template, const Tokenizer& tokenizer);

// The prompt with the tokenizer's leading special tokens (encode(prompt, true): Llama's BOS),
// then the completion and the end-of-text token, which carry the loss.
TokenizedSample tokenize_prompt_completion(const std::string& prompt, const std::string& completion,
                                           const Tokenizer& tokenizer);

// What a prepared dataset holds, reported when it is made.
struct SampleStats {
  int64_t samples = 0;
  int64_t tokens = 0;
  int64_t loss_tokens = 0;  // tokens - loss_tokens are masked
};

// Every sample of a dataset, tokenized: what a sample shard holds.
struct TokenizedSamples {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss;     // one flag per token
  std::vector<int64_t> offsets;  // samples + 1: where each sample starts, then the end
  SampleStats stats;
};

// Reads the JSONL files (or every regular file in a folder, in name order) of `format` kChat
// ({"messages": [{"role": ..., "content": ...}, ...]}) or kPromptCompletion ({"prompt": ...,
// "completion": ...}) and tokenizes each line as one sample (blank lines are skipped).
// `chat_template` may be null for kPromptCompletion. Throws std::invalid_argument naming the
// file and line of a line that is not JSON or lacks the keys (with the key), and when no token
// of the whole dataset carries a loss.
TokenizedSamples tokenize_samples(const std::vector<std::string>& inputs, DataFormat format,
                                  const Tokenizer& tokenizer, const ChatTemplate* chat_template);

// tokenize_samples(), written as the sample shard at `out_path` atomically (nothing is written
// when it throws).
SampleStats prepare_sample_shard(const std::vector<std::string>& inputs, DataFormat format,
                                 const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                                 const std::string& out_path);

// Layout of a sample shard, little-endian:
//   bytes 0-7   magic "STSAMPLE"
//   bytes 8-11  uint32 format version (1)
//   bytes 12-15 uint32 bytes per token (2 when the vocabulary fits in 16 bits, else 4)
//   bytes 16-23 uint64 number of tokens
//   bytes 24-31 uint64 vocabulary size of the tokenizer that wrote it
//   bytes 32-39 uint64 number of samples
//   then the tokens, one byte per token (1: the loss is taken on it), and the samples' offsets
//   into the tokens as uint64, samples + 1 of them (the first 0, the last the number of tokens).
void write_sample_shard(const std::string& path, const std::vector<int32_t>& tokens,
                        const std::vector<uint8_t>& loss, const std::vector<int64_t>& offsets,
                        int64_t vocab_size);

// A sample shard mapped read-only. Opening checks the magic, the version, the size and that the
// offsets rise from 0 to the number of tokens; errors name the file and what is wrong.
class SampleShard {
 public:
  explicit SampleShard(const std::string& path);
  ~SampleShard();
  SampleShard(const SampleShard&) = delete;
  SampleShard& operator=(const SampleShard&) = delete;

  int64_t num_samples() const { return num_samples_; }
  int64_t num_tokens() const { return num_tokens_; }
  uint64_t vocab_size() const { return vocab_size_; }
  int64_t length(int64_t sample) const;  // tokens in the sample
  // Tokens [begin, begin + count) of `sample` into `ids`, and their loss flags into `loss`.
  void read(int64_t sample, int64_t begin, int64_t count, int64_t* ids, uint8_t* loss) const;
  // How many of the sample's tokens [begin, begin + count) carry the loss.
  int64_t loss_tokens(int64_t sample, int64_t begin, int64_t count) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<detail::MappedFile> file_;
  uint32_t token_bytes_ = 2;
  int64_t num_tokens_ = 0, num_samples_ = 0;
  uint64_t vocab_size_ = 0;
  const unsigned char* tokens_ = nullptr;
  const uint8_t* loss_ = nullptr;
  const unsigned char* offsets_ = nullptr;  // uint64, possibly unaligned
};

}  // namespace shardtrain
