// Pipeline schedules: every rank runs each of its micro-batches' forward and backward exactly
// once, in orders that finish together, holding what each schedule promises; the bubble
// measured by running them with unit costs is the textbook one; and what cannot be scheduled is
// refused with the setting named.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "shardtrain/config.h"
#include "shardtrain/pipeline.h"

namespace shardtrain {
namespace pipeline_schedule_test {

using Kind = PipelineAction::Kind;

struct Case {
  PipelineScheduleKind kind;
  int ranks, virtual_stages, micro_batches;
};

std::vector<Case> cases() {
  std::vector<Case> all;
  for (int p : {2, 4}) {
    for (int m : {4, 8, 16}) {
      all.push_back({PipelineScheduleKind::kGpipe, p, 1, m});
      all.push_back({PipelineScheduleKind::kOneFOneB, p, 1, m});
      all.push_back({PipelineScheduleKind::kInterleaved1F1B, p, 2, m});
      all.push_back({PipelineScheduleKind::kZeroBubble, p, 1, m});
    }
  }
  return all;
}

// Runs the ranks' orders as the ranks would, each blocking on what it needs: true when all of
// them finish.
bool runs_to_the_end(const PipelineSchedule& s) {
  std::set<std::pair<int, int>> forward, input_grad;  // (stage, micro-batch) done
  std::vector<size_t> next(s.ranks, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < s.ranks; ++r) {
      while (next[r] < s.actions[r].size()) {
        const PipelineAction& a = s.actions[r][next[r]];
        const auto key = std::make_pair(a.stage, a.micro_batch);
        bool ready = true;
        if (a.kind == Kind::kForward) {
          ready = a.stage == 0 || forward.count({a.stage - 1, a.micro_batch});
        } else if (a.kind != Kind::kBackwardWeight) {
          ready = forward.count(key) &&
                  (a.stage == s.stages() - 1 || input_grad.count({a.stage + 1, a.micro_batch}));
        } else {
          ready = input_grad.count(key) > 0;
        }
        if (!ready) break;
        (a.kind == Kind::kForward ? forward : input_grad).insert(key);
        ++next[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < s.ranks; ++r) {
    if (next[r] != s.actions[r].size()) return false;
  }
  return true;
}

TEST(PipelineScheduleTest, EveryMicroBatchRunsOnceOnTheRankHoldingItsStage) {
  for (const Case& c : cases()) {
    const PipelineSchedule s =
        make_pipeline_schedule(c.kind, c.ranks, c.virtual_stages, c.micro_batches);
    SCOPED_TRACE(to_string(c.kind) + " P=" + std::to_string(c.ranks) +
                 " m=" + std::to_string(c.micro_batches));
    ASSERT_EQ(static_cast<int>(s.actions.size()), c.ranks);
    for (int r = 0; r < c.ranks; ++r) {
      std::map<std::pair<int, int>, int> counts;  // (kind, stage x m + micro-batch)
      for (const auto& a : s.actions[r]) {
        EXPECT_EQ(a.stage % c.ranks, r) << to_string(a);
        ++counts[{static_cast<int>(a.kind), a.stage * c.micro_batches + a.micro_batch}];
      }
      const bool split = c.kind == PipelineScheduleKind::kZeroBubble;
      const size_t per_kind = static_cast<size_t>(c.virtual_stages * c.micro_batches);
      EXPECT_EQ(s.actions[r].size(), per_kind * (split ? 3 : 2));
      for (const auto& [key, count] : counts) EXPECT_EQ(count, 1);
    }
    EXPECT_TRUE(runs_to_the_end(s));
  }
}

// GPipe holds every micro-batch; 1F1B at most P - rank on rank `rank`; interleaving holds more
// than 1F1B but not all; zero bubble's pending weight gradients stay bounded.
TEST(PipelineScheduleTest, MicroBatchesHeldAreWhatEachScheduleClaims) {
  for (const Case& c : cases()) {
    const PipelineSchedule s =
        make_pipeline_schedule(c.kind, c.ranks, c.virtual_stages, c.micro_batches);
    SCOPED_TRACE(to_string(c.kind) + " P=" + std::to_string(c.ranks) +
                 " m=" + std::to_string(c.micro_batches));
    for (int r = 0; r < c.ranks; ++r) {
      int held = 0, peak = 0;
      for (const auto& a : s.actions[r]) {
        if (a.kind == Kind::kForward) peak = std::max(peak, ++held);
        if (a.kind == Kind::kBackward || a.kind == Kind::kBackwardWeight) --held;
      }
      EXPECT_EQ(held, 0);
      switch (c.kind) {
        case PipelineScheduleKind::kGpipe:
          EXPECT_EQ(peak, c.micro_batches);
          break;
        case PipelineScheduleKind::kOneFOneB:
          EXPECT_EQ(peak, c.ranks - r);
          break;
        case PipelineScheduleKind::kInterleaved1F1B:
          EXPECT_LE(peak, (c.ranks - r - 1) * 2 + (c.virtual_stages - 1) * c.ranks + 1);
          break;
        case PipelineScheduleKind::kZeroBubble:
          EXPECT_LE(peak, 2 * (c.ranks - r));
          break;
      }
    }
  }
}

TEST(PipelineScheduleTest, SimulatedBubbleMatchesTheFormulaAndZeroBubbleBeatsIt) {
  for (int p : {2, 4}) {
    for (int m : {4, 8, 16}) {
      SCOPED_TRACE("P=" + std::to_string(p) + " m=" + std::to_string(m));
      const double formula = static_cast<double>(p - 1) / (m + p - 1);
      for (auto kind : {PipelineScheduleKind::kGpipe, PipelineScheduleKind::kOneFOneB}) {
        EXPECT_NEAR(make_pipeline_schedule(kind, p, 1, m).simulated_bubble, formula, 1e-12);
        EXPECT_NEAR(pipeline_bubble_formula(kind, p, 1, m), formula, 1e-12);
      }
      const double interleaved =
          make_pipeline_schedule(PipelineScheduleKind::kInterleaved1F1B, p, 2, m).simulated_bubble;
      EXPECT_LT(interleaved, formula);
      EXPECT_NEAR(pipeline_bubble_formula(PipelineScheduleKind::kInterleaved1F1B, p, 2, m),
                  formula / 2, 1e-12);
      EXPECT_LT(make_pipeline_schedule(PipelineScheduleKind::kZeroBubble, p, 1, m).simulated_bubble,
                formula);
    }
  }
}

TEST(PipelineScheduleTest, BlocksSplitEvenlyOrAsGiven) {
  using Ranges = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(pipeline_stage_blocks(8, 4, {}), (Ranges{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(pipeline_stage_blocks(7, 3, {}), (Ranges{{0, 3}, {3, 5}, {5, 7}}));
  EXPECT_EQ(pipeline_stage_blocks(6, 2, {5, 1}), (Ranges{{0, 5}, {5, 6}}));
}

void expect_refused(const std::function<void()>& fn, const std::string& words) {
  try {
    fn();
    ADD_FAILURE() << "accepted; expected: " << words;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(PipelineScheduleTest, RefusesWhatCannotBeScheduled) {
  expect_refused([] { parse_train_config("", "t.toml", {"parallel.pp_schedule=chimera"}); },
                 "parallel.pp_schedule \"chimera\" is not one of \"gpipe\", \"1f1b\"");
  expect_refused([] { make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, 4, 1, 2); },
                 "needs at least one micro-batch per stage: 2 micro-batch(es) per step "
                 "(train.grad_accum) for 4 pipeline stages");
  expect_refused([] { make_pipeline_schedule(PipelineScheduleKind::kZeroBubble, 4, 1, 3); },
                 "needs at least one micro-batch per stage");
  expect_refused([] { make_pipeline_schedule(PipelineScheduleKind::kInterleaved1F1B, 4, 2, 6); },
                 "make train.grad_accum a multiple of 4");
  expect_refused([] { make_pipeline_schedule(PipelineScheduleKind::kOneFOneB, 2, 2, 4); },
                 "parallel.pp_virtual_stages = 2 needs parallel.pp_schedule = "
                 "\"interleaved_1f1b\"");
  EXPECT_NO_THROW(make_pipeline_schedule(PipelineScheduleKind::kGpipe, 4, 1, 2));
  expect_refused([] { pipeline_stage_blocks(2, 4, {}); },
                 "the pipeline has 4 stages (parallel.pp x parallel.pp_virtual_stages) but the "
                 "model has only 2 blocks");
  expect_refused(
      [] {
        pipeline_stage_blocks(4, 2, {3, 2});
      },
      "parallel.pp_split = [3, 2] must give every stage at least one block and sum to "
      "the model's 4 blocks");
  expect_refused([] { pipeline_stage_blocks(4, 2, {4}); },
                 "parallel.pp_split = [4] has 1 entries; the pipeline has 2 stages");
}

}  // namespace pipeline_schedule_test
}  // namespace shardtrain
