// The trainer's check, before it allocates the model, that the run fits in the memory each rank
// may use here.
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/config.h"
#include "shardtrain/dist.h"

namespace shardtrain::detail {

// The host's available memory (MemAvailable of /proc/meminfo), bytes; -1 when unknown.
int64_t host_available_bytes();

// Refuses, before anything is allocated, what needs more than the host's available memory:
// throws std::invalid_argument "SUBJECT needs about X GB (WHY), more than the Y GB this host has
// available". Nothing happens when the available memory is unknown.
void require_host_memory(double needed_bytes, const std::string& subject, const std::string& why);

// What one rank of this process's group may use, and what limits it ("the memory cgroup's limit
// of 1.2 GB, shared by 2 ranks"). bytes < 0: nothing known limits it.
struct MemoryBudget {
  int64_t bytes = -1;
  std::string source;
};
// Collective over `world` (null: one process): ranks compare hosts and memory cgroups, so a
// limit shared by several ranks is divided among them.
MemoryBudget rank_memory_budget(ProcessGroup* world);

// Throws std::invalid_argument when the planner's estimate for `config` at `world_size` ranks,
// plus `held` (the resident bytes the process holds before building the model), exceeds
// `budget`; the message names the strategy, the bytes needed per rank and the first
// data-parallel strategy at this world size that fits.
void check_memory_fits(const TrainConfig& config, int world_size, const MemoryBudget& budget,
                       int64_t held);

}  // namespace shardtrain::detail
