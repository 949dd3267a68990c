// Pipeline parallelism: the model's blocks split into stages on the mesh's pp axis, micro-batches
// flowing through them in the order a schedule gives each rank (GPipe, 1F1B, interleaved 1F1B,
// zero bubble), activations and their gradients sent point to point between neighbours.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/parallel_names.h"

namespace shardtrain {

// One unit of a rank's work. Stage s (0 .. ranks x virtual_stages - 1) lives on pipeline rank
// s % ranks, so that with virtual stages each rank holds every ranks-th stage (Megatron's
// interleaving). A backward is either whole (kBackward), or split by the zero-bubble schedule
// into the input's gradient (kBackwardInput, which the stage before waits for) and the weights'
// gradients (kBackwardWeight, which nothing waits for and so fills the gaps).
struct PipelineAction {
  enum class Kind { kForward, kBackward, kBackwardInput, kBackwardWeight };
  Kind kind = Kind::kForward;
  int stage = 0;
  int micro_batch = 0;
  bool operator==(const PipelineAction& other) const {
    return kind == other.kind && stage == other.stage && micro_batch == other.micro_batch;
  }
};
std::string to_string(const PipelineAction& action);  // e.g. "F3.s1" (micro-batch 3, stage 1)

struct PipelineSchedule {
  PipelineScheduleKind kind = PipelineScheduleKind::kOneFOneB;
  int ranks = 1;
  int virtual_stages = 1;
  int micro_batches = 1;
  std::vector<std::vector<PipelineAction>> actions;  // per pipeline rank, in the order run
  // The same schedule run with unit costs (forward 1, input and weight gradient 1 each, whole
  // backward 2): the fraction of the ranks' time spent idle. Equals the textbook bubble
  // (ranks - 1) / (micro_batches + ranks - 1) for GPipe and 1F1B.
  double simulated_bubble = 0.0;
  int stages() const { return ranks * virtual_stages; }
};

// The schedule of `kind` for `ranks` pipeline ranks holding `virtual_stages` stages each and
// `micro_batches` micro-batches per step. Every rank's order respects the data dependencies in
// a way every other rank's order agrees with, so with sends that never block, no rank waits
// forever. Throws std::invalid_argument naming the setting that does not fit: 1F1B and zero
// bubble need micro_batches >= ranks, interleaving micro_batches a multiple of ranks, and only
// interleaved_1f1b takes virtual_stages > 1.
// How its errors name the settings: the trainer's config keys, or a command's flags.
struct PipelineSettingNames {
  std::string schedule = "parallel.pp_schedule";
  std::string ranks = "parallel.pp";
  std::string virtual_stages = "parallel.pp_virtual_stages";
  std::string micro_batches = "train.grad_accum";
  std::string assign = " = ";  // between a name and its value: " = " for keys, " " for flags
};
PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, int ranks, int virtual_stages,
                                        int micro_batches, const PipelineSettingNames& names = {});

// The textbook bubble fraction: (P - 1) / (m + P - 1) for GPipe, 1F1B and zero bubble (whose
// point is to do better), divided by V for interleaved 1F1B.
double pipeline_bubble_formula(PipelineScheduleKind kind, int ranks, int virtual_stages,
                               int micro_batches);

// The blocks [begin, end) of each of `stages` stages of an `n_blocks`-block model: `split` (the
// number of blocks per stage, as parallel.pp_split) when given, otherwise as even as possible
// with the larger stages first. Throws std::invalid_argument naming the sizes when there are
// more stages than blocks or `split` does not have one positive entry per stage summing to
// n_blocks.
std::vector<std::pair<int64_t, int64_t>> pipeline_stage_blocks(int64_t n_blocks, int stages,
                                                               const std::vector<int64_t>& split);

// When each action of one step ran on this rank, in seconds since the step began.
struct PipelineTimeline {
  struct Entry {
    PipelineAction action;
    double start = 0;
    double end = 0;
  };
  std::vector<Entry> entries;
  double step_seconds = 0;  // from the step's start to its last action's end
  // 1 - (time in actions) / step_seconds: this rank's idle share of the step.
  double idle_fraction() const;
};

}  // namespace shardtrain
