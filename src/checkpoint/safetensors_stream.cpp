#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "checkpoint/safetensors_detail.h"

namespace shardtrain::detail {
namespace {

const std::vector<std::pair<at::ScalarType, std::string>>& dtype_table() {
  static const std::vector<std::pair<at::ScalarType, std::string>> table = {
      {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kBFloat16, "BF16"}, {at::kHalf, "F16"},
      {at::kLong, "I64"},  {at::kInt, "I32"},    {at::kShort, "I16"},     {at::kChar, "I8"},
      {at::kByte, "U8"},   {at::kBool, "BOOL"}};
  return table;
}

}  // namespace

uint32_t crc32_of(const void* data, int64_t size, uint32_t crc) {
  const auto* bytes = static_cast<const Bytef*>(data);
  while (size > 0) {
    const uInt piece = static_cast<uInt>(std::min<int64_t>(size, 1 << 30));
    crc = static_cast<uint32_t>(::crc32(crc, bytes, piece));
    bytes += piece;
    size -= piece;
  }
  return crc;
}

std::string safetensors_dtype(at::ScalarType dtype) {
  for (const auto& [type, name] : dtype_table()) {
    if (type == dtype) return name;
  }
  throw std::invalid_argument(std::string("dtype ") + c10::toString(dtype) +
                              " cannot be stored in safetensors");
}

at::ScalarType dtype_from_safetensors(const std::string& name, const std::string& context) {
  for (const auto& [type, text] : dtype_table()) {
    if (text == name) return type;
  }
  throw std::invalid_argument(context + " has unsupported dtype '" + name + "'");
}

int64_t dtype_bytes(at::ScalarType dtype) { return static_cast<int64_t>(c10::elementSize(dtype)); }

void fsync_path(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

SafetensorsStreamWriter::SafetensorsStreamWriter(std::string path, std::vector<Entry> entries,
                                                 const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), entries_(std::move(entries)) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& entry : entries_) {
    int64_t numel = 1;
    for (int64_t s : entry.shape) numel *= s;
    const int64_t bytes = numel * dtype_bytes(entry.dtype);
    header[entry.key] = {{"dtype", safetensors_dtype(entry.dtype)},
                         {"shape", entry.shape},
                         {"data_offsets", {offset, offset + bytes}}};
    written_.push_back(Written{entry.key, offset, offset + bytes, 0});
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the format pads the header to 8 bytes
  const int64_t data_start = 8 + static_cast<int64_t>(text.size());
  for (auto& w : written_) {
    w.begin += data_start;
    w.end += data_start;
  }
  fd_ = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw std::runtime_error("cannot create '" + path_ + "': " + std::strerror(errno));
  }
  const uint64_t length = text.size();  // little-endian on every platform LibTorch supports
  write_bytes(&length, 8, crc32_of(&length, 8));
  write_bytes(text.data(), static_cast<int64_t>(text.size()),
              crc32_of(text.data(), static_cast<int64_t>(text.size())));
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() {
  if (fd_ >= 0) close(fd_);
}

void SafetensorsStreamWriter::write_bytes(const void* data, int64_t size, uint32_t crc) {
  // The file's checksum extends by the chunk's own (crc32_combine), so each byte is summed once.
  file_crc_ = static_cast<uint32_t>(crc32_combine(file_crc_, crc, static_cast<z_off_t>(size)));
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, static_cast<size_t>(std::min<int64_t>(size, 1 << 30)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("writing '" + path_ + "' failed: " + std::strerror(errno));
    p += n;
    size -= n;
    file_bytes_ += n;
  }
}

void SafetensorsStreamWriter::write(const at::Tensor& chunk) {
  if (chunk.numel() == 0) return;  // empty entries complete themselves
  while (current_ < entries_.size() && written_[current_].end == written_[current_].begin) {
    ++current_;
  }
  TORCH_CHECK(current_ < entries_.size(), "writing '", path_, "': more data than its ",
              entries_.size(), " entries hold");
  const Entry& entry = entries_[current_];
  TORCH_CHECK(chunk.scalar_type() == entry.dtype, "writing '", path_, "': entry '", entry.key,
              "' is ", entry.dtype, " but got ", chunk.scalar_type());
  const at::Tensor cpu = chunk.detach().to(at::kCPU).contiguous();
  const int64_t size = static_cast<int64_t>(cpu.nbytes());
  const Written& target = written_[current_];
  TORCH_CHECK(entry_done_ + size <= target.end - target.begin, "writing '", path_, "': entry '",
              entry.key, "' got more than its ", target.end - target.begin, " bytes");
  const uint32_t crc = crc32_of(cpu.data_ptr(), size);
  entry_crc_ = static_cast<uint32_t>(crc32_combine(entry_crc_, crc, static_cast<z_off_t>(size)));
  write_bytes(cpu.data_ptr(), size, crc);
  entry_done_ += size;
  // Move on past this entry and any empty ones after it.
  while (current_ < entries_.size() &&
         entry_done_ == written_[current_].end - written_[current_].begin) {
    written_[current_].crc32 = entry_crc_;
    ++current_;
    entry_done_ = 0;
    entry_crc_ = 0;
  }
}

std::vector<SafetensorsStreamWriter::Written> SafetensorsStreamWriter::finish() {
  while (current_ < entries_.size() && written_[current_].end == written_[current_].begin) {
    ++current_;  // trailing empty entries
  }
  if (current_ != entries_.size()) {
    throw std::runtime_error("writing '" + path_ + "': entry '" + entries_[current_].key +
                             "' is incomplete");
  }
  if (fsync(fd_) != 0 || close(fd_) != 0) {
    fd_ = -1;
    throw std::runtime_error("writing '" + path_ + "' failed: " + std::strerror(errno));
  }
  fd_ = -1;
  return written_;
}

}  // namespace shardtrain::detail
