// RUN_DIR/run.json: what a run trained (world size, model shape, batch, strategy, precision), so
// that tools such as `shardtrain plan --validate` can rebuild its configuration.
#pragma once

#include "shardtrain/config.h"

namespace shardtrain::detail {

// Writes RUN_DIR/run.json atomically (a temporary file renamed over it). Rank 0 calls it once the
// model's vocabulary size is final; other ranks must not.
void write_run_manifest(const TrainConfig& config, int world_size);

}  // namespace shardtrain::detail
