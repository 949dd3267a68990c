// RUN_DIR/run.json: what a run trained (world size, model shape, batch, strategy, precision), so
// that tools such as `shardtrain plan --validate` can rebuild its configuration.
#pragma once

#include <nlohmann/json.hpp>

#include "shardtrain/config.h"

namespace shardtrain::detail {

// What run.json holds for `config` on `world_size` ranks.
nlohmann::ordered_json run_manifest(const TrainConfig& config, int world_size);

// Writes RUN_DIR/run.json atomically (a temporary file renamed over it), with the resident
// bytes the process held before it built the model. Rank 0 calls it once the model's
// vocabulary size is final; other ranks must not.
void write_run_manifest(const TrainConfig& config, int world_size, int64_t resident_at_start);

}  // namespace shardtrain::detail
