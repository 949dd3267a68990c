// Files written whole: a message for one that cannot be written, with the reason the system
// gave ("cannot write 'x.tmp'" alone leaves a user guessing between a full disk, a read-only
// mount and permissions), and a replacement that is never seen half done.
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

// Writes `text` to `path` through a hidden temporary beside it (DIR/.NAME.tmp) renamed over it:
// a reader sees the old file or the new one, never half of either, and a write that fails (a
// full disk) leaves the old file and no temporary, throwing std::runtime_error(cannot_write(..)).
// With `durable`, the temporary is fsynced before the rename and the directory after it.
void replace_file(const std::string& path, const std::string& text, bool durable = false);

}  // namespace shardtrain::detail
