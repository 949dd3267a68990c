#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "common/file_error.h"
#include "shardtrain/checkpoint.h"

namespace fs = std::filesystem;

namespace shardtrain {
namespace {

void fsync_path(const fs::path& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string root, std::string name, int keep)
    : root_(std::move(root)), name_(std::move(name)), keep_(keep) {
  fs::create_directories(root_);
  staging_ = staging_path(root_, name_);
  // Leftovers of saves that were killed (a crash, Ctrl-C) before they could remove their
  // staging directory: no save of this root is in progress but this one.
  for (const auto& entry : fs::directory_iterator(root_)) {
    const std::string file = entry.path().filename().string();
    const std::string suffix = ".partial";
    if (file.size() > suffix.size() + 1 && file[0] == '.' &&
        file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0) {
      fs::remove_all(entry.path());
    }
  }
  fs::create_directories(staging_);
}

std::string CheckpointWriter::staging_path(const std::string& root, const std::string& name) {
  return (fs::path(root) / ("." + name + ".partial")).string();
}

std::string CheckpointWriter::commit() {
  for (const auto& entry : fs::directory_iterator(staging_)) fsync_path(entry.path());
  fsync_path(staging_);
  const fs::path final_dir = fs::path(root_) / name_;
  fs::remove_all(final_dir);  // an older save of the same step
  fs::rename(staging_, final_dir);
  // `latest` is replaced by rename too, so readers see the old or the new name, never half.
  const fs::path latest = fs::path(root_) / "latest";
  // Checked: an empty `latest` renamed over the good one would lose the run's place.
  detail::replace_file(latest.string(), name_ + "\n", /*durable=*/true);

  std::vector<std::string> complete;
  for (const auto& entry : fs::directory_iterator(root_)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0) complete.push_back(name);
  }
  std::sort(complete.begin(), complete.end());  // zero-padded step numbers sort by step
  for (size_t i = 0; i + keep_ < complete.size(); ++i) {
    if (complete[i] != name_) fs::remove_all(fs::path(root_) / complete[i]);
  }
  return final_dir.string();
}

std::string resolve_checkpoint(const std::string& root, const std::string& which) {
  fs::path dir;
  if (which == "latest") {
    std::ifstream in(fs::path(root) / "latest");
    std::string name;
    if (!in) {
      throw std::invalid_argument("run.resume = \"latest\" but '" + root +
                                  "/latest' does not exist (no checkpoint was saved; run.resume = "
                                  "\"auto\" starts a new run when there is none)");
    }
    if (!(in >> name)) {
      throw std::invalid_argument("'" + root +
                                  "/latest' is empty: it should name the checkpoint to resume "
                                  "from (e.g. step_000100); write that name into it, or resume "
                                  "from a checkpoint directory with run.resume = \"PATH\"");
    }
    dir = fs::path(root) / name;
  } else {
    dir = which;
  }
  if (!fs::is_directory(dir)) {
    throw std::invalid_argument("checkpoint '" + dir.string() + "' does not exist");
  }
  return dir.string();
}

}  // namespace shardtrain
