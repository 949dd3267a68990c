// What every rank of a run must agree on before it trains: the settings, and the run directory
// (one storage that every host sees, for checkpoints that every rank writes into).
#pragma once

#include "shardtrain/config.h"
#include "shardtrain/dist.h"

namespace shardtrain::detail {

// Compares a fingerprint of the settings that must be the same on every rank (everything
// but run.dir, which check_shared_run_dir checks by what it points to) with rank 0's. Throws
// std::invalid_argument on every rank, naming the ranks that differ. Collective over `world`.
void check_same_config(const TrainConfig& config, ProcessGroup& world);

// Rank 0 writes a random token into run.dir (which it has created); every rank reads it back
// from its own run.dir. Throws std::invalid_argument on every rank, naming the ranks that do not
// see rank 0's directory. Collective over `world`.
void check_shared_run_dir(const TrainConfig& config, ProcessGroup& world);

}  // namespace shardtrain::detail
