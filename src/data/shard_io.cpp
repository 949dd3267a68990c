#include "data/shard_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <stdexcept>

#include "common/file_error.h"

namespace shardtrain::detail {

std::string shard_header(const char (&magic)[8], uint64_t tokens, int64_t vocab_size,
                         uint32_t& token_bytes) {
  token_bytes = vocab_size <= 65536 ? 2 : 4;
  std::string header(magic, sizeof(magic));
  put<uint32_t>(header, 1);
  put<uint32_t>(header, token_bytes);
  put<uint64_t>(header, tokens);
  put<uint64_t>(header, static_cast<uint64_t>(vocab_size));
  return header;
}

void write_atomically(const std::string& path, const std::string& what,
                      const std::function<void(std::ofstream&)>& write) {
  const std::string tmp = path + ".tmp";
  {
    errno = 0;
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::invalid_argument(what + ": " + cannot_write(tmp));
    write(out);
    out.close();
    if (!out) {
      const std::string message = what + ": " + cannot_write(tmp);
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);  // a full disk keeps no half of it
      throw std::runtime_error(message);
    }
  }
  std::filesystem::rename(tmp, path);
}

void write_ids(std::ofstream& out, const std::vector<int32_t>& ids, uint32_t token_bytes) {
  if (token_bytes == 2) {
    std::vector<uint16_t> narrow(ids.begin(), ids.end());
    out.write(reinterpret_cast<const char*>(narrow.data()),
              static_cast<std::streamsize>(narrow.size() * 2));
  } else {
    out.write(reinterpret_cast<const char*>(ids.data()),
              static_cast<std::streamsize>(ids.size() * 4));
  }
}

MappedFile::MappedFile(const std::string& path, const std::string& what) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    throw std::invalid_argument(what + " '" + path + "' cannot be opened: " + std::strerror(errno));
  }
  struct stat info {};
  fstat(fd, &info);
  size_ = static_cast<size_t>(info.st_size);
  if (size_ == 0) {  // mmap refuses an empty mapping; the header checks then report the size
    close(fd);
    return;
  }
  void* mapping = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mapping == MAP_FAILED) {
    throw std::runtime_error(what + " '" + path + "' cannot be mapped: " + std::strerror(errno));
  }
  data_ = static_cast<const unsigned char*>(mapping);
}

MappedFile::~MappedFile() {
  if (data_) munmap(const_cast<unsigned char*>(data_), size_);
}

std::vector<std::string> files_of(const std::vector<std::string>& inputs, const std::string& what) {
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
      throw std::invalid_argument(what + " '" + input + "' does not exist");
    }
  }
  return files;
}

}  // namespace shardtrain::detail
