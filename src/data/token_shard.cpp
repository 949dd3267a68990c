#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "shardtrain/data.h"

namespace shardtrain {
namespace {

constexpr char kMagic[8] = {'S', 'T', 'T', 'O', 'K', 'E', 'N', 'S'};

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("corpus file '" + path + "' cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens,
                       int64_t vocab_size) {
  TORCH_CHECK(vocab_size > 0, "token shard: vocabulary size must be positive");
  const uint32_t token_bytes = vocab_size <= 65536 ? 2 : 4;
  std::string header;
  header.append(kMagic, sizeof(kMagic));
  put<uint32_t>(header, 1);
  put<uint32_t>(header, token_bytes);
  put<uint64_t>(header, tokens.size());
  put<uint64_t>(header, static_cast<uint64_t>(vocab_size));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::invalid_argument("cannot write token shard '" + path + "'");
    out.write(header.data(), header.size());
    if (token_bytes == 2) {
      std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
      out.write(reinterpret_cast<const char*>(narrow.data()), narrow.size() * 2);
    } else {
      out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
    }
    if (!out.flush()) throw std::runtime_error("writing token shard '" + path + "' failed");
  }
  std::filesystem::rename(tmp, path);
}

int64_t prepare_token_shard(const std::vector<std::string>& inputs, const Tokenizer& tokenizer,
                            const std::string& out_path) {
  if (inputs.empty()) throw std::invalid_argument("no corpus given");
  std::vector<std::string> files;
  for (const auto& input : inputs) {
    std::error_code error;
    if (std::filesystem::is_directory(input, error)) {
      std::vector<std::string> inside;
      for (const auto& entry : std::filesystem::directory_iterator(input)) {
        if (entry.is_regular_file()) inside.push_back(entry.path().string());
      }
      std::sort(inside.begin(), inside.end());
      files.insert(files.end(), inside.begin(), inside.end());
    } else if (std::filesystem::is_regular_file(input, error)) {
      files.push_back(input);
    } else {
      throw std::invalid_argument("corpus '" + input + "' does not exist");
    }
  }
  std::vector<int32_t> tokens;
  for (const auto& file : files) {
    const std::vector<int32_t> ids = tokenizer.encode(read_text(file));
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    tokens.push_back(tokenizer.eos_id());
  }
  write_token_shard(out_path, tokens, tokenizer.vocab_size());
  return static_cast<int64_t>(tokens.size());
}

TokenShard::TokenShard(const std::string& path) : path_(path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::invalid_argument("token shard '" + path +
                                "' cannot be opened: " + std::strerror(errno));
  }
  struct stat info {};
  fstat(fd, &info);
  const size_t bytes = static_cast<size_t>(info.st_size);
  if (bytes < kTokenShardHeaderBytes) {
    close(fd);
    throw std::invalid_argument("token shard '" + path + "' is truncated: " +
                                std::to_string(bytes) + " bytes, shorter than its header");
  }
  void* mapping = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mapping == MAP_FAILED) {
    throw std::runtime_error("token shard '" + path +
                             "' cannot be mapped: " + std::strerror(errno));
  }
  data_ = static_cast<const unsigned char*>(mapping);
  mapped_bytes_ = bytes;
  auto fail = [&](const std::string& what) {
    munmap(const_cast<unsigned char*>(data_), mapped_bytes_);
    data_ = nullptr;
    throw std::invalid_argument("token shard '" + path + "' " + what);
  };
  if (std::memcmp(data_, kMagic, sizeof(kMagic)) != 0) {
    fail("is not a token shard (bad magic; write one with `shardtrain data prepare`)");
  }
  std::memcpy(&header_.version, data_ + 8, 4);
  std::memcpy(&header_.token_bytes, data_ + 12, 4);
  std::memcpy(&header_.num_tokens, data_ + 16, 8);
  std::memcpy(&header_.vocab_size, data_ + 24, 8);
  if (header_.version != 1)
    fail("has format version " + std::to_string(header_.version) + ", expected 1");
  if (header_.token_bytes != 2 && header_.token_bytes != 4) {
    fail("declares " + std::to_string(header_.token_bytes) + " bytes per token (expected 2 or 4)");
  }
  const size_t expected = kTokenShardHeaderBytes + header_.num_tokens * header_.token_bytes;
  if (bytes != expected) {
    fail(std::string(bytes < expected ? "is truncated" : "has trailing bytes") + ": its header " +
         "announces " + std::to_string(header_.num_tokens) + " tokens (" +
         std::to_string(expected) + " bytes) but the file has " + std::to_string(bytes) + " bytes");
  }
}

TokenShard::~TokenShard() {
  if (data_) munmap(const_cast<unsigned char*>(data_), mapped_bytes_);
}

at::Tensor TokenShard::read(int64_t begin, int64_t count) const {
  TORCH_CHECK(begin >= 0 && count >= 0 && begin + count <= size(), "token shard '", path_,
              "': tokens [", begin, ", ", begin + count, ") are outside its ", size(), " tokens");
  const unsigned char* start = data_ + kTokenShardHeaderBytes + begin * header_.token_bytes;
  at::Tensor raw = at::empty({count}, header_.token_bytes == 2 ? at::kShort : at::kInt);
  std::memcpy(raw.data_ptr(), start, count * header_.token_bytes);
  // uint16 ids above 32767 come out negative from kShort; mask them back.
  at::Tensor ids = raw.to(at::kLong);
  if (header_.token_bytes == 2) ids = ids.bitwise_and(0xFFFF);
  return ids;
}

}  // namespace shardtrain
