// run.trace: every rank's timeline is well-formed Chrome trace JSON whose spans nest, whose
// collectives agree across the ranks of each group and whose steps fit in the measured step
// time; communication times reach metrics.jsonl.
#include "shardtrain/trace.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "shardtrain/rendezvous.h"
#include "shardtrain/train.h"
#include "support.h"
#include "train/run_config.h"

namespace shardtrain {
namespace trace_test {

namespace fs = std::filesystem;
using nlohmann::json;

// Timestamps are wall-clock microseconds in doubles (0.25 us resolution near today's epoch).
constexpr double kSlackUs = 2.0;

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::fresh_test_dir("shardtrain_trace");
    std::ofstream corpus(dir_ / "corpus.txt");
    for (int i = 0; i < 200; ++i) {
      corpus << "sphinx of black quartz, judge my vow number " << i % 11 << ".\n";
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  TrainConfig config(const std::vector<std::string>& overrides) const {
    std::vector<std::string> all = {"train.micro_batch=4", "train.steps=4", "train.grad_accum=2",
                                    "run.trace=true"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    return testing::tiny_run_config(dir_ / "corpus.txt", dir_ / "run", all);
  }

  // fit() on `world` in-process ranks.
  void train(int world, const std::vector<std::string>& overrides) {
    run_local_ranks(
        world,
        [&](ProcessGroup& group) {
          auto shared = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
          Trainer trainer(config(overrides), shared);
          trainer.fit();
        },
        ProcessGroupOptions().timeout(std::chrono::seconds(120)));
  }

  json read_trace(int rank) const {
    std::ifstream in(dir_ / "run" / "trace" / ("rank_" + std::to_string(rank) + ".json"));
    EXPECT_TRUE(in.good()) << "no trace for rank " << rank;
    return json::parse(in);
  }

  // The complete ("X") events of a trace.
  static std::vector<json> spans(const json& trace) {
    std::vector<json> out;
    for (const auto& event : trace.at("traceEvents")) {
      if (event.at("ph") == "X") out.push_back(event);
    }
    return out;
  }

  fs::path dir_;
};

double end_of(const json& span) {
  return span.at("ts").get<double>() + span.at("dur").get<double>();
}

// On each thread row, every span lies inside the one open when it began, or after it.
void expect_nested(const std::vector<json>& all) {
  std::map<int, std::vector<json>> rows;
  for (const auto& span : all) rows[span.at("tid").get<int>()].push_back(span);
  for (auto& [tid, row] : rows) {
    std::stable_sort(row.begin(), row.end(), [](const json& a, const json& b) {
      const double ta = a.at("ts"), tb = b.at("ts");
      return ta != tb ? ta < tb : a.at("dur").get<double>() > b.at("dur").get<double>();
    });
    std::vector<json> open;
    for (const auto& span : row) {
      EXPECT_GE(span.at("dur").get<double>(), 0.0);
      while (!open.empty() && span.at("ts").get<double>() >= end_of(open.back()) - kSlackUs) {
        open.pop_back();
      }
      if (!open.empty()) {
        EXPECT_LE(end_of(span), end_of(open.back()) + kSlackUs)
            << span.at("name") << " on row " << tid << " overlaps " << open.back().at("name")
            << " without nesting inside it";
      }
      open.push_back(span);
    }
  }
}

TEST_F(TraceTest, TracedDdpRunHasNestedSpansMatchingCollectivesAndStepsWithinTheirTime) {
  train(2, {"parallel.strategy=\"ddp\"", "run.trace_steps=[2, 3]", "train.checkpoint_every=2",
            "train.eval_every=2", "parallel.ddp.bucket_cap_mb=0.05"});
  // Step times from metrics.jsonl, by rank and step.
  std::map<std::pair<int, int>, double> step_time;
  {
    std::ifstream in(dir_ / "run" / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const json m = json::parse(line);
      step_time[{m.at("rank").get<int>(), m.at("step").get<int>()}] = m.at("step_time_s");
      ASSERT_TRUE(m.contains("comm")) << line;
      EXPECT_GT(m["comm"]["seconds"].get<double>(), 0.0);
      EXPECT_GT(m["comm"]["bytes"].get<int64_t>(), 0);
      // The training thread cannot wait longer than the step took.
      EXPECT_LE(m["comm"]["exposed_seconds"].get<double>(), m.at("step_time_s").get<double>());
    }
  }
  // Per group: the collectives each rank saw, in the group's order.
  std::map<std::string, std::map<int, std::vector<std::tuple<int64_t, std::string, int64_t>>>>
      collectives;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const json trace = read_trace(rank);
    const std::vector<json> all = spans(trace);
    ASSERT_FALSE(all.empty());
    for (const auto& span : all) EXPECT_EQ(span.at("pid").get<int>(), rank);
    expect_nested(all);

    std::map<std::string, int> names;
    for (const auto& span : all) ++names[span.at("name").get<std::string>()];
    EXPECT_EQ(names.count("step 1"), 0u);
    EXPECT_EQ(names["step 2"], 1);
    EXPECT_EQ(names["step 3"], 1);
    EXPECT_EQ(names.count("step 4"), 0u);
    EXPECT_EQ(names["forward"], 4);  // two micro-batches in each of two steps
    EXPECT_EQ(names["backward"], 4);
    EXPECT_EQ(names["optimizer"], 2);
    EXPECT_GE(names["blocks.0 forward"], 4);  // and evaluation's forward passes
    EXPECT_EQ(names["blocks.1 backward"], 4);
    EXPECT_EQ(names["checkpoint save"], 1);  // after step 2, inside the traced range
    EXPECT_GE(names["eval"], 1);

    for (const auto& step : all) {
      if (step.at("cat") != "step") continue;
      const int n = step.at("args").at("step");
      // The step's span is the step time metrics.jsonl reports, and the spans directly inside
      // it on the same row add up to no more than it.
      EXPECT_NEAR(step.at("dur").get<double>(), step_time.at({rank, n}) * 1e6, 5.0);
      double children = 0;
      for (const auto& span : all) {
        const std::string name = span.at("name");
        const bool part = name == "forward" || name == "backward" || name == "optimizer";
        if (part && span.at("tid") == step.at("tid") &&
            span.at("ts").get<double>() >= step.at("ts").get<double>() - kSlackUs &&
            end_of(span) <= end_of(step) + kSlackUs) {
          children += span.at("dur").get<double>();
        }
      }
      EXPECT_GT(children, 0.0);
      EXPECT_LE(children, step.at("dur").get<double>() + kSlackUs);
    }
    for (const auto& span : all) {
      if (span.at("cat") != "comm") continue;
      const json& args = span.at("args");
      collectives[args.at("group")][rank].emplace_back(args.at("seq").get<int64_t>(),
                                                       args.at("op").get<std::string>(),
                                                       args.at("bytes").get<int64_t>());
    }
  }
  ASSERT_FALSE(collectives.empty());
  bool gradients_reduced = false;
  for (auto& [group, by_rank] : collectives) {
    SCOPED_TRACE("group " + group);
    ASSERT_EQ(by_rank.size(), 2u);
    for (auto& [rank, ops] : by_rank) std::sort(ops.begin(), ops.end());
    EXPECT_EQ(by_rank[0], by_rank[1]);
    for (const auto& [seq, op, bytes] : by_rank[0]) {
      gradients_reduced = gradients_reduced || (op == "all_reduce" && bytes > 1024);
    }
  }
  EXPECT_TRUE(gradients_reduced) << "no bucket all-reduce was traced";

  // One file for both ranks, through the CLI.
  const auto merged =
      testing::run_command(testing::cli() + " trace merge " + (dir_ / "run").string());
  ASSERT_EQ(merged.exit_code, 0) << merged.output;
  std::ifstream in(dir_ / "run" / "trace.json");
  const json all = json::parse(in);
  EXPECT_EQ(spans(all).size(), spans(read_trace(0)).size() + spans(read_trace(1)).size());
}

TEST_F(TraceTest, FsdpRunTracesGathersAndReductionsOnEveryRank) {
  train(2, {"parallel.strategy=\"fsdp\"", "run.trace_steps=[1, 1]"});
  std::map<int, std::vector<std::tuple<int64_t, std::string, int64_t>>> world;
  for (int rank = 0; rank < 2; ++rank) {
    const std::vector<json> all = spans(read_trace(rank));
    expect_nested(all);
    std::map<std::string, int> ops;
    for (const auto& span : all) {
      if (span.at("cat") != "comm") continue;
      ++ops[span.at("args").at("op").get<std::string>()];
      world[rank].emplace_back(span.at("args").at("seq").get<int64_t>(),
                               span.at("args").at("group").get<std::string>() + " " +
                                   span.at("args").at("op").get<std::string>(),
                               span.at("args").at("bytes").get<int64_t>());
    }
    EXPECT_GT(ops["all_gather"], 0);
    EXPECT_GT(ops["reduce_scatter"], 0);
  }
  std::sort(world[0].begin(), world[0].end());
  std::sort(world[1].begin(), world[1].end());
  EXPECT_EQ(world[0], world[1]);
}

TEST_F(TraceTest, OffloadToFilesAndRecomputationNestAndShowTheirTransfers) {
  const fs::path nvme = dir_ / "nvme";
  fs::create_directories(nvme);
  train(2, {"parallel.strategy=\"zero\"", "parallel.zero.stage=3",
            "parallel.zero.offload_optimizer=\"nvme\"", "parallel.zero.offload_param=\"nvme\"",
            "parallel.zero.nvme_path=\"" + nvme.string() + "\"",
            "train.activation_checkpointing=true", "run.trace_steps=[2, 3]"});
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const json trace = read_trace(rank);
    const std::vector<json> all = spans(trace);
    expect_nested(all);
    int64_t read = 0, written = 0;
    std::map<std::string, int> names;
    for (const auto& span : all) {
      const std::string name = span.at("name");
      ++names[name];
      if (name == "file read") read += span.at("args").at("bytes").get<int64_t>();
      if (name == "file write") written += span.at("args").at("bytes").get<int64_t>();
    }
    EXPECT_GT(read, 0);
    EXPECT_GT(written, 0);
    EXPECT_EQ(names["blocks.1 backward"], 4);  // recomputed inside, still one span each
    // The transfers of the I/O threads are on rows of their own, named.
    std::map<int, std::string> rows;
    for (const auto& event : trace.at("traceEvents")) {
      if (event.at("ph") == "M" && event.at("name") == "thread_name") {
        rows[event.at("tid").get<int>()] = event.at("args").at("name");
      }
    }
    EXPECT_EQ(rows.at(1), "train");
    bool io_row = false;
    for (const auto& span : all) {
      if (span.at("cat") == "offload" && rows.at(span.at("tid").get<int>()) != "train")
        io_row = true;
    }
    EXPECT_TRUE(io_row);
  }
}

TEST_F(TraceTest, BadTraceSettingsAndMissingTracesAreNamed) {
  try {
    config({"run.trace_steps=[3, 9]"}).validate();
    FAIL() << "a trace range past train.steps was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("run.trace_steps [3, 9] is outside the run"),
              std::string::npos)
        << e.what();
  }
  try {
    config({"run.trace_steps=[3, 2]"}).validate();
    FAIL() << "a backwards trace range was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("last >= first"), std::string::npos) << e.what();
  }
  const auto result = testing::run_command(testing::cli() + " trace merge " + dir_.string());
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.output.find("has no trace/ directory"), std::string::npos) << result.output;
  // A run without run.trace writes no trace.
  train(1, {"run.trace=false"});
  EXPECT_FALSE(fs::exists(dir_ / "run" / "trace"));
}

TEST_F(TraceTest, ProgressLineHasAnEtaAndATerminalGetsABar) {
  {
    std::ofstream config(dir_ / "tiny.toml");
    config << "[model]\npreset = \"tiny\"\n[data]\ncorpus = \"" << (dir_ / "corpus.txt").string()
           << "\"\nseq_len = 32\neval_sequences = 4\n[train]\nsteps = 6\nmicro_batch = 2\n"
           << "sample_tokens = 0\n[run]\nlog_every = 2\n";
  }
  const std::string train = testing::cli() + " train --config " + (dir_ / "tiny.toml").string();
  // Redirected: lines with an ETA until the last step, and no bar.
  const auto piped = testing::run_command(train + " --set run.dir=" + (dir_ / "a").string());
  ASSERT_EQ(piped.exit_code, 0) << piped.output;
  EXPECT_NE(piped.output.find("step     2/6 |"), std::string::npos) << piped.output;
  EXPECT_NE(piped.output.find("| eta "), std::string::npos) << piped.output;
  EXPECT_EQ(piped.output.find("[#"), std::string::npos) << piped.output;
  // On a terminal (script(1) gives the program one): the bar too.
  if (!fs::exists("/dev/ptmx") ||
      testing::run_command("script -qec true /dev/null").exit_code != 0) {
    GTEST_SKIP() << "no pseudo-terminal here (script -qec true failed): the bar is not checked";
  }
  const auto tty = testing::run_command("script -qec '" + train +
                                        " --set run.dir=" + (dir_ / "b").string() + "' /dev/null");
  ASSERT_EQ(tty.exit_code, 0) << tty.output;
  EXPECT_NE(tty.output.find("] 3/6 eta "), std::string::npos) << tty.output;
}

}  // namespace trace_test
}  // namespace shardtrain
