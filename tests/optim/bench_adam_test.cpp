#include <gtest/gtest.h>

#include <filesystem>

#include "support.h"

namespace shardtrain {
namespace bench_adam_test {

using testing::cli;
using testing::run_command;

TEST(BenchAdamTest, PrintsEveryVariantAgainstLibTorchAndTheBound) {
  const auto dir = testing::fresh_test_dir("bench_adam");
  const auto result = run_command(cli() + " bench adam --params 20K --threads 1 --repeats 1 " +
                                  "--nvme-chunk 3000 --nvme-dir " + dir.string());
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const char* text : {"params 20000, threads 1", "copy (memcpy)", "torch::optim::AdamW",
                           "fused AdamW ", "fused AdamW + bf16 copy", "NVMe-swapped (page cache)",
                           "vs_torch", "of_bound", "in-memory fused step time"}) {
    EXPECT_NE(result.output.find(text), std::string::npos) << text << "\n" << result.output;
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "state files left behind";
  std::filesystem::remove_all(dir);
}

TEST(BenchAdamTest, BadOptionsExitTwoNamingThem) {
  auto result = run_command(cli() + " bench adam --params 0 --nvme-dir ''");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--params must be > 0"), std::string::npos) << result.output;
  result = run_command(cli() + " bench adam --params 1000 --nvme-dir /nonexistent/nvme");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("'/nonexistent/nvme' does not exist"), std::string::npos)
      << result.output;
  // More than any host here has: refused before anything is allocated.
  result = run_command(cli() + " bench adam --params 1000G --nvme-dir ''");
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--params 1000000000000 needs about 22000.00 GB"), std::string::npos)
      << result.output;
  result = run_command(cli() + " bench adam --help");
  for (const char* flag : {"--params", "--threads", "--repeats", "--nvme-dir", "--nvme-chunk"}) {
    EXPECT_NE(result.output.find(flag), std::string::npos) << flag << "\n" << result.output;
  }
}

}  // namespace bench_adam_test
}  // namespace shardtrain
