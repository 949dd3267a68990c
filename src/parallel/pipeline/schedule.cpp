// Pipeline schedules: each rank's order of forwards and backwards, checked by running the whole
// pipeline with unit costs, which also measures the schedule's bubble.
#include <algorithm>
#include <deque>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "shardtrain/pipeline.h"

namespace shardtrain {
namespace {

using Kind = PipelineAction::Kind;

// The forwards and backwards of one rank in the schedule's order (the zero-bubble schedule's
// weight gradients are placed by simulate()).
std::vector<PipelineAction> main_order(PipelineScheduleKind kind, int ranks, int virtual_stages,
                                       int micro_batches, int rank) {
  std::vector<PipelineAction> order;
  const Kind backward =
      kind == PipelineScheduleKind::kZeroBubble ? Kind::kBackwardInput : Kind::kBackward;
  auto forward = [&](int mb) { order.push_back({Kind::kForward, rank, mb}); };
  auto back = [&](int mb) { order.push_back({backward, rank, mb}); };
  if (kind == PipelineScheduleKind::kGpipe) {
    // Every forward, then every backward: all micro-batches' activations are held at once.
    for (int mb = 0; mb < micro_batches; ++mb) forward(mb);
    for (int mb = 0; mb < micro_batches; ++mb) back(mb);
    return order;
  }
  if (kind != PipelineScheduleKind::kInterleaved1F1B) {
    // 1F1B: enough forwards to fill the pipeline below this rank, then one forward and one
    // backward in turn, then the backwards left: at most ranks - rank micro-batches held.
    const int warmup = std::min(ranks - rank - 1, micro_batches);
    for (int mb = 0; mb < warmup; ++mb) forward(mb);
    for (int i = 0; i + warmup < micro_batches; ++i) {
      forward(i + warmup);
      back(i);
    }
    for (int mb = std::max(0, micro_batches - warmup); mb < micro_batches; ++mb) back(mb);
    return order;
  }
  // Interleaved (Megatron): forwards go through the rank's stages in groups of `ranks`
  // micro-batches, backwards through them in reverse; the warm-up is longer by the stages.
  const int total = micro_batches * virtual_stages;
  const int group = ranks * virtual_stages;
  auto action = [&](int k, bool is_forward) {
    const int in_group = k % group;
    int chunk = in_group / ranks;
    if (!is_forward) chunk = virtual_stages - 1 - chunk;
    const int mb = k / group * ranks + in_group % ranks;
    return PipelineAction{is_forward ? Kind::kForward : Kind::kBackward, chunk * ranks + rank, mb};
  };
  const int warmup = std::min((ranks - rank - 1) * 2 + (virtual_stages - 1) * ranks, total);
  for (int k = 0; k < warmup; ++k) order.push_back(action(k, true));
  for (int i = 0; i + warmup < total; ++i) {
    order.push_back(action(i + warmup, true));
    order.push_back(action(i, false));
  }
  for (int k = std::max(0, total - warmup); k < total; ++k) order.push_back(action(k, false));
  return order;
}

int cost_of(Kind kind) { return kind == Kind::kBackward ? 2 : 1; }

// Runs the ranks' orders with unit costs. A rank runs its next action as soon as what it needs
// is done (the stage before's forward, the stage after's input gradient). The zero-bubble
// schedule runs a pending weight gradient when its next action must wait, or when more than
// ranks - rank - 1 are pending (which bounds the activations held, as ZB-H1 does). Fills
// schedule.actions with the order run, and the bubble; throws std::logic_error if the orders
// cannot all finish.
void simulate(PipelineSchedule& schedule, const std::vector<std::vector<PipelineAction>>& orders) {
  const int ranks = schedule.ranks, stages = schedule.stages(), m = schedule.micro_batches;
  constexpr int kNotDone = 1 << 30;
  std::vector<std::vector<int>> forward_done(stages, std::vector<int>(m, kNotDone));
  std::vector<std::vector<int>> input_grad_done(stages, std::vector<int>(m, kNotDone));
  std::vector<size_t> next(ranks, 0);
  std::vector<int> free_at(ranks, 0);
  std::vector<std::deque<PipelineAction>> pending(ranks);
  schedule.actions.assign(ranks, {});
  size_t remaining = 0;
  for (const auto& order : orders) {
    for (const auto& a : order) remaining += a.kind == Kind::kBackwardInput ? 2 : 1;  // and its W
  }
  auto ready = [&](const PipelineAction& a, int t) {
    if (a.kind == Kind::kForward)
      return a.stage == 0 || forward_done[a.stage - 1][a.micro_batch] <= t;
    if (forward_done[a.stage][a.micro_batch] > t) return false;
    return a.stage == stages - 1 || input_grad_done[a.stage + 1][a.micro_batch] <= t;
  };
  int64_t busy = 0;
  const int limit = static_cast<int>(remaining) * 4 + 4 * stages + 16;
  int t = 0;
  for (; remaining > 0; ++t) {
    if (t > limit) throw std::logic_error("pipeline schedule: the ranks' orders deadlock");
    for (int r = 0; r < ranks; ++r) {
      if (free_at[r] > t) continue;
      const auto& order = orders[r];
      const size_t cap = static_cast<size_t>(ranks - r - 1);
      std::optional<PipelineAction> run;
      if (!pending[r].empty() && pending[r].size() > cap) {
        run = pending[r].front();
      } else if (next[r] < order.size() && ready(order[next[r]], t)) {
        run = order[next[r]++];
      } else if (!pending[r].empty()) {
        run = pending[r].front();
      }
      if (!run) continue;
      if (run->kind == Kind::kBackwardWeight) pending[r].pop_front();
      const int end = t + cost_of(run->kind);
      if (run->kind == Kind::kForward) forward_done[run->stage][run->micro_batch] = end;
      if (run->kind == Kind::kBackward || run->kind == Kind::kBackwardInput) {
        input_grad_done[run->stage][run->micro_batch] = end;
      }
      if (run->kind == Kind::kBackwardInput) {
        pending[r].push_back({Kind::kBackwardWeight, run->stage, run->micro_batch});
      }
      schedule.actions[r].push_back(*run);
      free_at[r] = end;
      busy += end - t;
      --remaining;
    }
  }
  const int finish = *std::max_element(free_at.begin(), free_at.end());
  schedule.simulated_bubble =
      1.0 - static_cast<double>(busy) / (static_cast<double>(ranks) * static_cast<double>(finish));
}

}  // namespace

std::string to_string(const PipelineAction& action) {
  const char* letter = action.kind == Kind::kForward         ? "F"
                       : action.kind == Kind::kBackward      ? "B"
                       : action.kind == Kind::kBackwardInput ? "I"
                                                             : "W";
  return letter + std::to_string(action.micro_batch) + ".s" + std::to_string(action.stage);
}

PipelineSchedule make_pipeline_schedule(PipelineScheduleKind kind, int ranks, int virtual_stages,
                                        int micro_batches, const PipelineSettingNames& names) {
  const std::string name = names.schedule + names.assign + "\"" + to_string(kind) + "\"";
  if (ranks < 1 || virtual_stages < 1 || micro_batches < 1) {
    throw std::invalid_argument(name +
                                ": pipeline ranks, virtual stages and micro-batches must "
                                "be positive");
  }
  if (virtual_stages > 1 && kind != PipelineScheduleKind::kInterleaved1F1B) {
    throw std::invalid_argument(names.virtual_stages + names.assign +
                                std::to_string(virtual_stages) + " needs " + names.schedule +
                                names.assign + "\"interleaved_1f1b\" (" + name +
                                " runs one stage per rank)");
  }
  const std::string counts = std::to_string(micro_batches) + " micro-batch(es) per step (" +
                             names.micro_batches + ") for " + std::to_string(ranks) +
                             " pipeline stages (" + names.ranks + ")";
  if (kind != PipelineScheduleKind::kGpipe && micro_batches < ranks) {
    throw std::invalid_argument(name + " needs at least one micro-batch per stage: " + counts +
                                "; raise " + names.micro_batches + " or use \"gpipe\"");
  }
  if (kind == PipelineScheduleKind::kInterleaved1F1B && micro_batches % ranks != 0) {
    throw std::invalid_argument(
        name + " sends micro-batches round in groups of one per stage: " + counts +
        " do not divide; make " + names.micro_batches + " a multiple of " + std::to_string(ranks));
  }
  PipelineSchedule schedule;
  schedule.kind = kind;
  schedule.ranks = ranks;
  schedule.virtual_stages = virtual_stages;
  schedule.micro_batches = micro_batches;
  std::vector<std::vector<PipelineAction>> orders;
  for (int r = 0; r < ranks; ++r) {
    orders.push_back(main_order(kind, ranks, virtual_stages, micro_batches, r));
  }
  simulate(schedule, orders);
  return schedule;
}

double pipeline_bubble_formula(PipelineScheduleKind kind, int ranks, int virtual_stages,
                               int micro_batches) {
  const double p = ranks, m = micro_batches;
  const double bubble = (p - 1.0) / (m + p - 1.0);
  return kind == PipelineScheduleKind::kInterleaved1F1B ? bubble / virtual_stages : bubble;
}

std::vector<std::pair<int64_t, int64_t>> pipeline_stage_blocks(int64_t n_blocks, int stages,
                                                               const std::vector<int64_t>& split) {
  if (stages > n_blocks) {
    throw std::invalid_argument("the pipeline has " + std::to_string(stages) +
                                " stages (parallel.pp x parallel.pp_virtual_stages) but the model "
                                "has only " +
                                std::to_string(n_blocks) + " blocks");
  }
  std::vector<int64_t> sizes = split;
  if (sizes.empty()) {
    for (int s = 0; s < stages; ++s) sizes.push_back(n_blocks / stages + (s < n_blocks % stages));
  }
  auto listed = [&] {
    std::string text;
    for (int64_t size : split) text += (text.empty() ? "" : ", ") + std::to_string(size);
    return "parallel.pp_split = [" + text + "]";
  };
  if (static_cast<int>(sizes.size()) != stages) {
    throw std::invalid_argument(listed() + " has " + std::to_string(sizes.size()) +
                                " entries; the pipeline has " + std::to_string(stages) +
                                " stages (parallel.pp x parallel.pp_virtual_stages)");
  }
  if (std::any_of(sizes.begin(), sizes.end(), [](int64_t size) { return size < 1; }) ||
      std::accumulate(sizes.begin(), sizes.end(), int64_t{0}) != n_blocks) {
    throw std::invalid_argument(listed() + " must give every stage at least one block and sum " +
                                "to the model's " + std::to_string(n_blocks) + " blocks");
  }
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t begin = 0;
  for (int64_t size : sizes) {
    ranges.emplace_back(begin, begin + size);
    begin += size;
  }
  return ranges;
}

double PipelineTimeline::idle_fraction() const {
  if (step_seconds <= 0) return 0.0;
  double working = 0;
  for (const auto& entry : entries) working += entry.end - entry.start;
  return std::max(0.0, 1.0 - working / step_seconds);
}

}  // namespace shardtrain
