#include "train/run_dir.h"

#include <cstdio>
#include <cstdlib>
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

}  // namespace

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
