// `shardtrain bench scaling`: launched runs at each rank count, their throughput, efficiency
// and the breakdown of a step from the runs' traces.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support.h"

namespace shardtrain {
namespace bench_scaling_test {

namespace fs = std::filesystem;
using nlohmann::json;

TEST(BenchScalingTest, RunsEachRankCountAndSplitsTheStep) {
  const fs::path dir = testing::fresh_test_dir("shardtrain_scaling");
  {
    std::ofstream corpus(dir / "corpus.txt");
    for (int i = 0; i < 300; ++i) corpus << "the quick brown fox " << i % 17 << " jumps.\n";
    std::ofstream config(dir / "tiny.toml");
    config << "[model]\npreset = \"tiny\"\n[data]\ncorpus = \"" << (dir / "corpus.txt").string()
           << "\"\nseq_len = 32\neval_sequences = 4\n[train]\nmicro_batch = 4\nwarmup = 1\n"
           << "[run]\nthreads = 1\n";
  }
  const fs::path out = dir / "scaling";
  const auto result = testing::run_command(
      testing::cli() + " bench scaling --config " + (dir / "tiny.toml").string() +
      " --ranks 1,2 --strategies ddp,zero3 --steps 5 --out " + out.string());
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::ifstream in(out / "scaling.json");
  const json scaling = json::parse(in);
  EXPECT_EQ(scaling["mode"], "strong");
  const json& rows = scaling["rows"];
  ASSERT_EQ(rows.size(), 4u);
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& row = rows[i];
    SCOPED_TRACE(row.dump());
    EXPECT_EQ(row["ranks"], i % 2 ? 2 : 1);
    EXPECT_EQ(row["global_batch"], 8);  // strong scaling: 4 per rank at the most ranks
    EXPECT_NEAR(row["tokens_per_s"].get<double>(), 8 * 32 / row["step_time_s"].get<double>(),
                1e-6 * row["tokens_per_s"].get<double>());
    const double base = rows[i - i % 2]["tokens_per_s"];
    EXPECT_NEAR(row["efficiency"].get<double>(),
                row["tokens_per_s"].get<double>() / (base * row["ranks"].get<double>()), 1e-9);
    // The split of the traced step adds up to it, and nothing in it is negative.
    for (const char* part : {"compute_s", "trace_exposed_comm_s", "other_s"}) {
      EXPECT_GE(row[part].get<double>(), -1e-5) << part;  // 2 us of clock slack
    }
    EXPECT_GT(row["compute_s"].get<double>(), 0.0);
    if (row["ranks"] == 2) {
      EXPECT_GT(row["comm_s"].get<double>(), 0.0);
    }
  }
  EXPECT_TRUE(fs::exists(out / "scaling.md"));
  // The report draws it.
  const auto report = testing::run_command(testing::cli() + " report " + out.string());
  ASSERT_EQ(report.exit_code, 0) << report.output;
  EXPECT_TRUE(fs::exists(out / "report.html"));

  const auto bad = testing::run_command(testing::cli() + " bench scaling --config " +
                                        (dir / "tiny.toml").string() + " --strategies ddp,tp");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.output.find("unknown strategy 'tp'"), std::string::npos) << bad.output;
  fs::remove_all(dir);
}

}  // namespace bench_scaling_test
}  // namespace shardtrain
