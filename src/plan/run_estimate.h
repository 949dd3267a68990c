// The planner's estimate of one run, described as RUN_DIR/run.json describes it: what
// `plan --validate` compares a finished run with, and what the trainer checks against the
// memory it may use before it allocates anything.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "shardtrain/plan.h"

namespace shardtrain::detail {

struct RunEstimate {
  Candidate run;  // the run's own configuration, per rank
  // DDP, ZeRO-1, ZeRO-2, ZeRO-3 / full_shard and ZeRO-3 with offload at the run's world size,
  // with the same model and batch, in that order (least sharded first).
  std::vector<Candidate> alternatives;
};

// `run` has run.json's keys (world_size, model, train, parallel, precision); `source` names it
// in errors. For a CPU host: offload to "cpu" changes nothing (it is the same memory), offload
// to files ("nvme") takes the optimizer state / the fp32 parameter shards out of the estimate.
// Throws std::invalid_argument naming a missing key or an impossible shape.
RunEstimate estimate_run(const nlohmann::json& run, const HardwareSpec& host,
                         const std::string& source);

// The config keys that select data-parallel candidate `c` (one of RunEstimate::alternatives),
// as a sentence's object: "parallel.strategy = \"zero\" with parallel.zero.stage = 1".
std::string config_setting(const Candidate& c);

}  // namespace shardtrain::detail
