// The run directory's contract: a new run never mixes with an old one, a restarted job
// continues from its latest checkpoint, and nothing is changed before the decision is made.
#pragma once

#include <string>

#include "shardtrain/config.h"

namespace shardtrain::detail {

// How a run starts in run.dir, decided from the config and what the directory holds.
struct RunStart {
  std::string checkpoint;     // the checkpoint to resume from; empty for a new run
  bool drop_metrics = false;  // a new run where an earlier attempt left metrics (resume "auto")
  std::string move_aside;     // run.overwrite: where the old run goes; empty when nothing moves
};

// True when `dir` holds a run: metrics.jsonl, or a checkpoints/ folder with anything in it.
bool holds_run(const std::string& dir);

// Decides how the run starts without changing anything; every rank gets the same answer from
// the same directory. `restarted`: a launcher restarted the job (an unset run.resume then
// means "auto"). Throws std::invalid_argument naming the directory and the ways forward when a
// new run would mix with an old one, or when the checkpoint to resume from does not exist.
RunStart plan_run_start(const TrainConfig& config, bool restarted);

// Carries out `start` on the file system (moves the old run aside, drops stale metrics) and
// creates run.dir. Rank 0 only, after every rank has called plan_run_start.
void prepare_run_dir(const TrainConfig& config, const RunStart& start);

// The run that owns a run directory: rank 0 holds an exclusive flock(2) on RUN_DIR/.lock for
// the run's life, with its process id and host written in it. The kernel drops the lock when
// the process ends, however it ends, so a lock file nobody holds is a finished run's.
class RunDirLock {
 public:
  // Creates `dir` if needed and takes its lock. Throws std::invalid_argument naming the
  // process that holds it (a second run started into the same directory).
  explicit RunDirLock(const std::string& dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

// Throws std::invalid_argument naming the process when a live run holds `dir`'s lock: checked
// before a new run changes anything there (run.overwrite's move, dropping metrics, a resume).
void check_not_in_use(const std::string& dir);

}  // namespace shardtrain::detail
