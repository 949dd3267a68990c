#include "common/file_error.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace shardtrain::detail {
namespace {

void sync(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace

void replace_file(const std::string& path, const std::string& text, bool durable) {
  const std::filesystem::path target(path);
  const std::string tmp =
      (target.parent_path() / ("." + target.filename().string() + ".tmp")).string();
  {
    errno = 0;
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      const std::string message = cannot_write(tmp);
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw std::runtime_error(message);
    }
  }
  if (durable) sync(tmp);
  std::filesystem::rename(tmp, path);
  if (durable) sync(std::filesystem::path(path).parent_path().string());
}

}  // namespace shardtrain::detail
