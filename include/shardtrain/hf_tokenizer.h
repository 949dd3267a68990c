// A model's own tokenizer, read from Hugging Face's tokenizer.json (the `tokenizers` library's
// format) and the tokenizer_config.json beside it.
//
// Supported: BPE models, byte-level (as Qwen3, Llama 3 and 3.1, DeepSeek V3 use) and
// SentencePiece-style with byte fallback (as Llama 2 and Gemma 3 use; those six are tested against
// a reference); the normalizers, pre-tokenizers, post-processors and decoders such files use
// (docs/tokenizers.md lists them); added tokens matched in the text as the file says (special or
// not, lstrip/rstrip/single_word, normalized). Anything else that would change the ids is refused
// by name, never ignored. (Truncation and padding settings are ignored, as transformers ignores
// them unless a call asks for them.)
#pragma once

#include <memory>
#include <string>

#include "shardtrain/tokenizer.h"

namespace shardtrain {

// Loads the tokenizer at `path`: a tokenizer.json file, or a folder holding one. A
// tokenizer_config.json in the same folder supplies bos_token, eos_token, add_bos_token and
// add_eos_token (which set what encode(text, true) adds, as transformers does for Llama and
// Gemma). Throws std::invalid_argument naming the file and what is wrong or unsupported (a missing
// file, malformed JSON, an unknown model, normalizer or pre-tokenizer type, a token the merges
// name that the vocabulary lacks).
//
// encode(text) is Hugging Face's encode(text, add_special_tokens=False): added tokens that appear
// in the text become their ids. encode(text, true) also adds what transformers adds: the
// post-processor's tokens, or, on a side (start or end) where tokenizer_config.json sets
// add_bos_token / add_eos_token, its bos_token / eos_token or nothing. bos_id() is the first token
// added before the text (-1 if none); eos_id() is tokenizer_config.json's eos_token, or without
// one the file's special token </s>, <|endoftext|>, <|end_of_text|> or <eos> (loading fails if
// there is none). token_id() takes a token as spelled in the file ("Ġthe" in a byte-level
// vocabulary); is_special() is true for the file's special added tokens, eos and bos.
//
// Text that is not valid UTF-8 (which Hugging Face's library cannot be given): the valid parts are
// tokenized as usual and each invalid byte becomes that byte's token (byte-level models) or its
// byte-fallback token <0xNN>. decode() keeps bytes as they are where Hugging Face would put
// U+FFFD, so decode(encode(text)) == text wherever the format allows it: always for byte-level
// models without a normalizer, for NFC text with an NFC normalizer; docs/tokenizers.md says which.
//
// name() says what the model is and where it came from, with a hash of both files' contents
// ("tokenizer.json BPE (byte-level) from /path [1234abcd5678ef90]"). Thread-safe as every
// Tokenizer; the object owns all it needs (the files may go away after loading).
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

// Whether `path` is a file whose name ends in "tokenizer.json" or a folder that holds a
// tokenizer.json.
bool is_hf_tokenizer_path(const std::string& path);

// The tokenizer `name_or_path` stands for: "byte", "gpt2" (GPT-2's encoder.json and vocab.bpe in
// `gpt2_dir`, or default_gpt2_dir() when it is empty), or a tokenizer.json file or a folder
// holding one (load_hf_tokenizer). Throws std::invalid_argument naming `name_or_path` when it is
// none of these, or the file that fails to load.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name_or_path,
                                          const std::string& gpt2_dir = "");

}  // namespace shardtrain
