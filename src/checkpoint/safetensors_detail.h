// Private pieces of the safetensors format shared by the plain file I/O, the sharded checkpoint
// and the Hugging Face export: dtype names and a writer that streams tensor data after a header
// computed up front, so a file can be written without holding all of its tensors at once.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace shardtrain::detail {

// "F32", "BF16", ... for a dtype safetensors can hold; throws std::invalid_argument otherwise.
std::string safetensors_dtype(at::ScalarType dtype);
// The dtype of a safetensors name; throws std::invalid_argument naming `context` otherwise.
at::ScalarType dtype_from_safetensors(const std::string& name, const std::string& context);
int64_t dtype_bytes(at::ScalarType dtype);
// zlib's crc32 of `size` bytes, continuing from `crc` (fed in pieces: zlib takes a uInt length).
uint32_t crc32_of(const void* data, int64_t size, uint32_t crc = 0);

// Opens `path` and writes the safetensors header describing `entries`; their data follows
// through write() calls, entry after entry, in the order given. finish() checks that every byte
// arrived, fsyncs and closes. The destructor of an unfinished writer closes the file and leaves
// it incomplete (callers write into staging directories).
class SafetensorsStreamWriter {
 public:
  struct Entry {
    std::string key;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  struct Written {
    std::string key;
    int64_t begin = 0;  // absolute byte offsets in the file, [begin, end)
    int64_t end = 0;
    uint32_t crc32 = 0;  // zlib's crc32 of those bytes
  };

  SafetensorsStreamWriter(std::string path, std::vector<Entry> entries,
                          const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  // Appends `chunk` (CPU or not, any layout; its dtype must be the current entry's) to the data
  // of the current entry; an entry may arrive in several chunks but never spans two.
  void write(const at::Tensor& chunk);
  // Every entry's byte range and checksum. Throws std::runtime_error naming the file when data
  // is missing or a write failed.
  std::vector<Written> finish();
  int64_t bytes() const { return file_bytes_; }
  uint32_t file_crc32() const { return file_crc_; }

 private:
  // Writes `size` bytes whose crc32 is `crc`.
  void write_bytes(const void* data, int64_t size, uint32_t crc);

  std::string path_;
  std::vector<Entry> entries_;
  std::vector<Written> written_;
  int fd_ = -1;
  size_t current_ = 0;      // entry being written
  int64_t entry_done_ = 0;  // bytes of it written so far
  int64_t file_bytes_ = 0;
  uint32_t entry_crc_ = 0;
  uint32_t file_crc_ = 0;
};

// One tensor of a safetensors header; [begin, end) are offsets into the data section.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t begin = 0;
  int64_t end = 0;
};

struct SafetensorsHeader {
  int64_t data_start = 0;  // file offset of the data section
  std::vector<SafetensorsEntry> entries;  // in the header's order
  std::map<std::string, std::string> metadata;
};

// Reads and validates the header of the safetensors file `path` (see safetensors_header.cpp
// for the rules). Throws std::invalid_argument naming the file and the tensor at fault.
SafetensorsHeader read_safetensors_header(const std::string& path);

// `json` as an int64 when it is a JSON integer that fits (not a float, a string or a number
// beyond int64, which nlohmann's get<> would convert without a check); `json_int64s` for an
// array of them. std::invalid_argument naming `what` otherwise.
int64_t json_int64(const nlohmann::json& json, const std::string& what);
std::vector<int64_t> json_int64s(const nlohmann::json& json, const std::string& what);

// The element count / byte count of `shape`; std::invalid_argument naming `context` for a
// negative size or a count that overflows int64.
int64_t checked_numel(const std::vector<int64_t>& shape, const std::string& context);
int64_t checked_bytes(const std::vector<int64_t>& shape, at::ScalarType dtype,
                      const std::string& context);

// fsyncs a file or directory; errors are ignored where the file system cannot sync directories.
void fsync_path(const std::string& path);

}  // namespace shardtrain::detail
