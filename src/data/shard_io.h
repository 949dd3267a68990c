// What token shards and sample shards share: little-endian header fields, files written through
// a temporary renamed into place, read-only mappings, and the files a corpus argument names.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace shardtrain::detail {

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
T get(const unsigned char* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

// The fields both shard headers begin with: the 8-byte magic, format version 1, bytes per token
// (2 when the vocabulary fits in 16 bits, else 4: returned through `token_bytes`), the number of
// tokens and the vocabulary size.
std::string shard_header(const char (&magic)[8], uint64_t tokens, int64_t vocab_size,
                         uint32_t& token_bytes);

// Writes `path` through `path`.tmp, renamed over it once `write` has filled it and it was
// flushed, so a reader never sees half a file. `what` names the file in errors.
void write_atomically(const std::string& path, const std::string& what,
                      const std::function<void(std::ofstream&)>& write);

// Writes `ids` with `token_bytes` bytes each (2: narrowed to uint16).
void write_ids(std::ofstream& out, const std::vector<int32_t>& ids, uint32_t token_bytes);

// `path` mapped read-only in its whole. Throws std::invalid_argument "<what> '<path>' cannot be
// opened: ..." (or std::runtime_error when the mapping fails).
class MappedFile {
 public:
  MappedFile(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

// The files `inputs` name: regular files as given, and every regular file inside a folder in
// name order. Throws std::invalid_argument "<what> '<input>' does not exist".
std::vector<std::string> files_of(const std::vector<std::string>& inputs, const std::string& what);

// Refuses an output path that is one of the inputs (or inside an input folder, whose files are
// read as the corpus), or a directory, before anything is read or written.
void check_output_is_not_input(const std::vector<std::string>& inputs, const std::string& out_path);

}  // namespace shardtrain::detail
