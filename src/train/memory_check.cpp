#include "train/memory_check.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "plan/run_estimate.h"
#include "train/run_manifest.h"

namespace shardtrain::detail {
namespace {

std::string gb(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f GB", bytes / 1e9);
  return text;
}

// The first line of `path` as a byte count; -1 when unreadable or "max". Limits near 2^63 are
// cgroup v1's way of saying "none".
int64_t read_limit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    const long long value = std::stoll(text);
    return value <= 0 || value >= (1LL << 62) ? -1 : value;
  } catch (const std::exception&) {
    return -1;
  }
}

// This process's memory cgroup and its limit (v1 memory controller, else v2's unified tree).
struct Cgroup {
  std::string path;
  int64_t limit = -1;
};

Cgroup memory_cgroup() {
  std::ifstream in("/proc/self/cgroup");
  Cgroup v1, v2;
  for (std::string line; std::getline(in, line);) {
    const size_t first = line.find(':');
    const size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');) {
      if (c == "memory") {
        v1.path = path;
        v1.limit = read_limit("/sys/fs/cgroup/memory" + path + "/memory.limit_in_bytes");
      }
    }
    if (controllers.empty()) {
      v2.path = path;
      v2.limit = read_limit("/sys/fs/cgroup" + path + "/memory.max");
      if (v2.limit < 0) v2.limit = read_limit("/sys/fs/cgroup/unified" + path + "/memory.max");
    }
  }
  return v1.limit >= 0 ? v1 : v2;
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

int64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) == 0) return std::stoll(line.substr(13)) * 1024;
  }
  return -1;
}

void require_host_memory(double needed_bytes, const std::string& subject, const std::string& why) {
  const int64_t available = host_available_bytes();
  if (available < 0 || needed_bytes <= static_cast<double>(available)) return;
  char sizes[128];
  std::snprintf(sizes, sizeof(sizes), " needs about %.2f GB (%s), more than the %.2f GB",
                needed_bytes / 1e9, why.c_str(), static_cast<double>(available) / 1e9);
  throw std::invalid_argument(subject + sizes + " this host has available");
}

MemoryBudget rank_memory_budget(ProcessGroup* world) {
  const Cgroup cgroup = memory_cgroup();
  const std::string host = host_name();
  // Ranks on the same host (and in the same cgroup) share its memory: count them.
  int on_host = 1, in_cgroup = 1;
  if (world && world->size() > 1) {
    const auto key = [](const std::string& s) {
      return static_cast<int64_t>(std::hash<std::string>()(s) >> 1);
    };
    at::Tensor mine = at::tensor({key(host), key(host + "\n" + cgroup.path)}, at::kLong);
    at::Tensor all = at::empty({2 * world->size()}, at::kLong);
    world->all_gather(mine, all)->wait();
    const at::Tensor pairs = all.view({-1, 2});
    on_host = static_cast<int>((pairs.select(1, 0) == mine[0]).sum().item<int64_t>());
    in_cgroup = static_cast<int>((pairs.select(1, 1) == mine[1]).sum().item<int64_t>());
  }
  MemoryBudget budget;
  auto consider = [&budget](int64_t limit, int ranks, const std::string& what) {
    if (limit < 0) return;
    const int64_t share = limit / ranks;
    if (budget.bytes >= 0 && share >= budget.bytes) return;
    budget.bytes = share;
    budget.source = what + " of " + gb(static_cast<double>(limit)) + ", shared by " +
                    std::to_string(ranks) + (ranks == 1 ? " rank" : " ranks");
  };
  consider(cgroup.limit, in_cgroup, "the memory cgroup's limit (" + cgroup.path + ")");
  consider(host_available_bytes(), on_host, "the host's available memory");
  return budget;
}

void check_memory_fits(const TrainConfig& config, int world_size, const MemoryBudget& budget,
                       int64_t held_bytes) {
  if (budget.bytes < 0) return;
  RunEstimate estimate;
  try {
    estimate =
        estimate_run(run_manifest(config, world_size), hardware_spec("cpu"), "the run's settings");
  } catch (const std::invalid_argument&) {
    // Settings the planner cannot model (an invalid hybrid shape, ...): the strategy's own
    // checks name them in a moment; no estimate, no check.
    return;
  }
  // What the process holds already (LibTorch, communication buffers, the corpus): measured.
  const double held = static_cast<double>(held_bytes);
  const double limit = static_cast<double>(budget.bytes);
  const MemoryBreakdown& m = estimate.run.memory;
  // run.checkpoint_async copies this rank's share of each checkpoint (fp32 parameters and
  // AdamW's two moments, split over the ranks) to host memory while it is written.
  const double checkpoint_copy =
      config.run.checkpoint_async
          ? 12.0 * static_cast<double>(config.model.num_parameters()) / world_size
          : 0.0;
  // precision.fp8's emulation keeps, for each block linear layer's backward, fp32 copies of its
  // rounded weight (the blocks' linear weights again, whole under any sharding) and of its
  // rounded input (per token about 6 d_model + ffn_hidden floats a block).
  double fp8_copies = 0.0;
  if (config.precision.fp8 != "none") {
    const ModelConfig& model = config.model;
    const double d = static_cast<double>(model.d_model);
    const double embeddings =
        d * static_cast<double>(model.vocab_size) * (model.tie_embeddings ? 1.0 : 2.0);
    const double block_weights =
        std::max(0.0, static_cast<double>(model.num_parameters()) - embeddings);
    const double tokens =
        static_cast<double>(config.train.micro_batch) * static_cast<double>(config.data.seq_len);
    // Under activation checkpointing the forward keeps nothing; the recomputation keeps one
    // block's copies at a time.
    const double layers = static_cast<double>(model.n_layers);
    const double blocks = config.train.activation_checkpointing ? 1.0 : layers;
    fp8_copies = 4.0 * block_weights * blocks / layers +
                 4.0 * tokens * (6.0 * d + static_cast<double>(model.ffn_hidden)) * blocks;
  }
  // What the process needs beside the planner's estimate of a layout.
  const double beside = held + checkpoint_copy + fp8_copies;
  const double needed = beside + m.total();
  if (needed <= limit) return;
  std::string message =
      "out of memory before the start: " +
      (config.parallel.strategy == ParallelStrategy::kNone ? std::string("training in one process")
                                                           : estimate.run.label()) +
      " (parallel.strategy = \"" + to_string(config.parallel.strategy) + "\") on " +
      std::to_string(world_size) + (world_size == 1 ? " rank" : " ranks") + " needs about " +
      gb(needed) + " per rank (the planner's estimate: parameters " + gb(m.params) +
      ", gradients " + gb(m.grads) + ", optimizer state " + gb(m.optimizer) + ", activations " +
      gb(m.activations + m.temporary) +
      (checkpoint_copy > 0 ? ", the asynchronous checkpoint's copy " + gb(checkpoint_copy)
                           : std::string()) +
      (fp8_copies > 0 ? ", precision.fp8's fp32 copies " + gb(fp8_copies) : std::string()) +
      "; plus " + gb(held) + " the process holds already), but each rank here may use " +
      gb(limit) + " (" + budget.source + "). ";
  const Candidate* fits = nullptr;
  for (const auto& c : estimate.alternatives) {
    if (beside + c.memory.total() <= limit) {
      fits = &c;
      break;
    }
  }
  if (fits) {
    message += fits->label() + " fits (about " + gb(beside + fits->memory.total()) +
               " per rank): set " + config_setting(*fits) + ". ";
  } else {
    message += "No data-parallel strategy fits on " + std::to_string(world_size) +
               (world_size == 1 ? " rank" : " ranks") + ": use more ranks or hosts. ";
  }
  throw std::invalid_argument(message + "run.memory_check = false starts anyway.");
}

}  // namespace shardtrain::detail
