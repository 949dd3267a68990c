#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "data/shard_io.h"
#include "shardtrain/data.h"

namespace shardtrain {
namespace {

constexpr char kTokenMagic[8] = {'S', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("corpus file '" + path + "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A document's tokens: what the tokenizer adds before a sequence (Llama's BOS; nothing for
// GPT-2), its text, and the end-of-text token.
void append_document(const Tokenizer& tokenizer, const std::string& text,
                     std::vector<int32_t>& tokens) {
  const std::vector<int32_t> ids = tokenizer.encode(text, /*add_special=*/true);
  tokens.insert(tokens.end(), ids.begin(), ids.end());
  if (ids.empty() || ids.back() != tokenizer.eos_id()) tokens.push_back(tokenizer.eos_id());
}

// A .jsonl file holds one document per line, {"text": ...}; blank lines are skipped.
void append_jsonl_documents(const Tokenizer& tokenizer, const std::string& path,
                            std::vector<int32_t>& tokens) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("corpus file '" + path + "' cannot be read");
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = "'" + path + "' line " + std::to_string(number);
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument(where + " is not JSON (" + e.what() + ")");
    }
    if (!json.is_object() || !json.contains("text") || !json.at("text").is_string()) {
      throw std::invalid_argument(where +
                                  " has no string \"text\" (data.format \"text\" reads "
                                  "{\"text\": ...} lines from .jsonl files)");
    }
    append_document(tokenizer, json.at("text").get<std::string>(), tokens);
  }
}

}  // namespace

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens,
                       int64_t vocab_size) {
  TORCH_CHECK(vocab_size > 0, "token shard: vocabulary size must be positive");
  uint32_t token_bytes = 0;
  const std::string header =
      detail::shard_header(kTokenMagic, tokens.size(), vocab_size, token_bytes);
  detail::write_atomically(path, "token shard", [&](std::ofstream& out) {
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    detail::write_ids(out, tokens, token_bytes);
  });
}

std::vector<int32_t> tokenize_corpus(const std::vector<std::string>& inputs,
                                     const Tokenizer& tokenizer) {
  if (inputs.empty()) throw std::invalid_argument("no corpus given");
  std::vector<int32_t> tokens;
  const std::vector<std::string> files = detail::files_of(inputs, "corpus");
  for (const auto& file : files) {
    if (std::filesystem::path(file).extension() == ".jsonl") {
      append_jsonl_documents(tokenizer, file, tokens);
    } else {
      append_document(tokenizer, read_text(file), tokens);
    }
  }
  const int32_t eos = tokenizer.eos_id();
  if (std::all_of(tokens.begin(), tokens.end(), [eos](int32_t id) { return id == eos; })) {
    // An empty folder, or files without text: nothing to train on, named as it was given.
    std::string given;
    for (const auto& input : inputs) given += (given.empty() ? "'" : ", '") + input + "'";
    throw std::invalid_argument("corpus " + given + " holds no text (" +
                                std::to_string(files.size()) + " file(s))");
  }
  return tokens;
}

namespace detail {

void check_output_is_not_input(const std::vector<std::string>& inputs,
                               const std::string& out_path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path out = fs::weakly_canonical(out_path, error);
  if (error) return;  // the writer names what is wrong with the path
  if (fs::is_directory(out)) {
    throw std::invalid_argument("output '" + out_path + "' is a directory: give a file path");
  }
  for (const auto& input : inputs) {
    const fs::path in = fs::weakly_canonical(input, error);
    if (error) continue;
    if (in == out) {
      throw std::invalid_argument("output '" + out_path + "' is the input '" + input +
                                  "': writing it would replace the text it is made from");
    }
    if (fs::is_directory(in) && out.parent_path() == in) {
      throw std::invalid_argument("output '" + out_path + "' is inside the input folder '" + input +
                                  "', whose files are read as the corpus");
    }
  }
}

}  // namespace detail

int64_t prepare_token_shard(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                            const std::string& out_path) {
  detail::check_output_is_not_input(inputs, out_path);
  const std::vector<int32_t> tokens = tokenize_corpus(inputs, tokenizer);
  write_token_shard(out_path, tokens, tokenizer.vocab_size());
  return static_cast<int64_t>(tokens.size());
}

TokenShard::TokenShard(const std::string& path)
    : path_(path), file_(std::make_unique<detail::MappedFile>(path, "token shard")) {
  const size_t bytes = file_->size();
  data_ = file_->data();
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument("token shard '" + path + "' " + what);
  };
  if (bytes < kTokenShardHeaderBytes) {
    fail("is truncated: " + std::to_string(bytes) + " bytes, shorter than its header");
  }
  if (std::memcmp(data_, kTokenMagic, sizeof(kTokenMagic)) != 0) {
    fail("is not a token shard (bad magic; write one with `shardtrain data prepare`)");
  }
  header_.version = detail::get<uint32_t>(data_ + 8);
  header_.token_bytes = detail::get<uint32_t>(data_ + 12);
  header_.num_tokens = detail::get<uint64_t>(data_ + 16);
  header_.vocab_size = detail::get<uint64_t>(data_ + 24);
  if (header_.version != 1)
    fail("has format version " + std::to_string(header_.version) + ", expected 1");
  if (header_.token_bytes != 2 && header_.token_bytes != 4) {
    fail("declares " + std::to_string(header_.token_bytes) + " bytes per token (expected 2 or 4)");
  }
  // A count larger than the file cannot be right, and would overflow the size below.
  if (header_.num_tokens > bytes) {
    fail("is truncated: its header announces " + std::to_string(header_.num_tokens) +
         " tokens but the file has " + std::to_string(bytes) + " bytes");
  }
  const size_t expected = kTokenShardHeaderBytes + header_.num_tokens * header_.token_bytes;
  if (bytes != expected) {
    fail(std::string(bytes < expected ? "is truncated" : "has trailing bytes") + ": its header " +
         "announces " + std::to_string(header_.num_tokens) + " tokens (" +
         std::to_string(expected) + " bytes) but the file has " + std::to_string(bytes) + " bytes");
  }
}

TokenShard::~TokenShard() = default;

at::Tensor TokenShard::read(int64_t begin, int64_t count) const {
  TORCH_CHECK(begin >= 0 && count >= 0 && begin + count <= size(), "token shard '", path_,
              "': tokens [", begin, ", ", begin + count, ") are outside its ", size(), " tokens");
  const unsigned char* start = data_ + kTokenShardHeaderBytes + begin * header_.token_bytes;
  at::Tensor raw = at::empty({count}, header_.token_bytes == 2 ? at::kShort : at::kInt);
  std::memcpy(raw.data_ptr(), start, count * header_.token_bytes);
  // uint16 ids above 32767 come out negative from kShort; mask them back.
  at::Tensor ids = raw.to(at::kLong);
  if (header_.token_bytes == 2) ids = ids.bitwise_and(0xFFFF);
  // An id the header's vocabulary does not have is damage, named here with the file and the
  // place rather than later by the model's embedding.
  const auto vocab = static_cast<int64_t>(header_.vocab_size);
  if (count == 0) return ids;
  const auto [low, high] = at::aminmax(ids);
  if (low.item<int64_t>() < 0 || high.item<int64_t>() >= vocab) {
    const int64_t at = ((ids < 0) | (ids >= vocab)).nonzero()[0][0].item<int64_t>();
    throw std::invalid_argument("token shard '" + path_ + "' holds token id " +
                                std::to_string(ids[at].item<int64_t>()) + " at token " +
                                std::to_string(begin + at) + ", outside the vocabulary of " +
                                std::to_string(vocab) +
                                " its header declares (the file is damaged; write it again "
                                "with `shardtrain data prepare`)");
  }
  return ids;
}

}  // namespace shardtrain
