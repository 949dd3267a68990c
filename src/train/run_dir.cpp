#include "train/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "shardtrain/checkpoint.h"

namespace fs = std::filesystem;

namespace shardtrain::detail {
namespace {

// The first RUN_DIR.old.N that does not exist.
std::string aside_name(const std::string& dir) {
  const std::string base = fs::path(dir).lexically_normal().string();
  const std::string trimmed =
      base.size() > 1 && base.back() == '/' ? base.substr(0, base.size() - 1) : base;
  for (int n = 1;; ++n) {
    const std::string candidate = trimmed + ".old." + std::to_string(n);
    if (!fs::exists(candidate)) return candidate;
  }
}

constexpr const char* kLockName = ".lock";

// Tries to take the exclusive lock of an open lock file; "" when taken, else who holds it (what
// the holder wrote in it).
std::string try_lock(int fd, const std::string& path) {
  if (::flock(fd, LOCK_EX | LOCK_NB) == 0) return "";
  if (errno != EWOULDBLOCK) {
    throw std::runtime_error("cannot lock '" + path + "': " + std::strerror(errno));
  }
  char text[256] = {};
  const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string();
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return holder.empty() ? "another process" : holder;
}

std::string in_use_message(const std::string& dir, const std::string& holder) {
  return "run.dir '" + dir + "' is in use by a run that is still going (" + holder +
         "): wait for it to end, or give this run another run.dir";
}

}  // namespace

RunDirLock::RunDirLock(const std::string& dir) {
  fs::create_directories(dir);
  const std::string path = (fs::path(dir) / kLockName).string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    // A directory the system refuses (read-only, no permission) is bad input, as a path is.
    throw std::invalid_argument("run.dir: cannot open '" + path + "': " + std::strerror(errno));
  }
  const std::string holder = try_lock(fd_, path);
  if (!holder.empty()) {
    ::close(fd_);
    fd_ = -1;
    throw std::invalid_argument(in_use_message(dir, holder));
  }
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string me = "process " + std::to_string(::getpid()) + " on " + host + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) < 0) {
    // The lock holds without the note; a second run is told "another process".
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor drops the lock
}

void check_not_in_use(const std::string& dir) {
  const std::string path = (fs::path(dir) / kLockName).string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // no lock file: no run has been here, or one from before locks
  std::string holder;
  try {
    holder = try_lock(fd, path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);  // drops the lock taken only to look
  if (!holder.empty()) throw std::invalid_argument(in_use_message(dir, holder));
}

bool holds_run(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(fs::path(dir) / "metrics.jsonl", ec)) return true;
  const fs::path checkpoints = fs::path(dir) / "checkpoints";
  return fs::is_directory(checkpoints, ec) && !fs::is_empty(checkpoints, ec);
}

RunStart plan_run_start(const TrainConfig& config, bool restarted) {
  const std::string root = (fs::path(config.run.dir) / "checkpoints").string();
  const std::string resume = config.run.resume.empty() && restarted ? "auto" : config.run.resume;
  if (!resume.empty() && config.run.overwrite) {
    throw std::invalid_argument("run.overwrite = true starts a new run and run.resume = \"" +
                                resume + "\" continues the old one in '" + config.run.dir +
                                "': set one of them");
  }
  RunStart start;
  if (resume == "auto") {
    if (fs::exists(fs::path(root) / "latest")) {
      start.checkpoint = resolve_checkpoint(root, "latest");
    } else {
      start.drop_metrics = true;
    }
    return start;
  }
  if (!resume.empty()) {
    start.checkpoint = resolve_checkpoint(root, resume);
    return start;
  }
  if (!holds_run(config.run.dir)) return start;
  if (!config.run.overwrite) {
    throw std::invalid_argument(
        "run.dir '" + config.run.dir +
        "' already holds a run (metrics.jsonl or checkpoints/): continue it with run.resume = "
        "\"auto\" (or \"latest\"), or start over with run.overwrite = true, which moves the old "
        "run to '" +
        aside_name(config.run.dir) + "'");
  }
  start.move_aside = aside_name(config.run.dir);
  return start;
}

void prepare_run_dir(const TrainConfig& config, const RunStart& start) {
  if (!start.move_aside.empty()) {
    fs::rename(config.run.dir, start.move_aside);
    std::printf("run.overwrite: moved the previous run in '%s' to '%s'\n", config.run.dir.c_str(),
                start.move_aside.c_str());
  }
  if (start.drop_metrics) fs::remove(fs::path(config.run.dir) / "metrics.jsonl");
  fs::create_directories(config.run.dir);
}

}  // namespace shardtrain::detail
