// Messages for a file that cannot be written, with the reason the system gave: "cannot write
// 'x.tmp'" alone leaves a user guessing between a full disk, a read-only mount and permissions.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

namespace shardtrain::detail {

// "cannot write 'PATH': REASON", the reason from `error` (the errno the failed operation left;
// EIO when it left none).
inline std::string cannot_write(const std::string& path, int error = errno) {
  return "cannot write '" + path + "': " + std::strerror(error != 0 ? error : EIO);
}

}  // namespace shardtrain::detail
