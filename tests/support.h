// Helpers shared by the tests: running the CLI, finding a free port, reading metrics.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardtrain::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `command` through the shell, capturing both output streams.
inline CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return result;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

inline std::string cli() { return SHARDTRAIN_CLI_PATH; }

// An empty directory of the running test's own under the system temp dir (named after the
// process and the test, so parallel test processes never share one).
inline std::filesystem::path fresh_test_dir(const std::string& prefix) {
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + "_" + std::to_string(getpid()) + "_" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A loopback port nothing listens on right now (the kernel's choice for port 0).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// Whether process `pid` still runs (a zombie no one reaped does not).
inline bool alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z';
}

// Losses by step from rank 0's lines of a metrics.jsonl file.
inline std::vector<double> rank0_losses(const std::filesystem::path& file) {
  std::vector<double> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.at("rank").get<int>() == 0) out.push_back(j.at("loss").get<double>());
  }
  return out;
}

// Per-step losses equal within `tolerance`, relative.
inline void expect_same_losses(const std::vector<double>& got, const std::vector<double>& want,
                               double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tolerance * std::abs(want[i])) << "step " << i + 1;
  }
}

// A planner's shardtrain.toml, written into `dir` as it is and trained for two steps on `nproc`
// launched ranks with dir/corpus.txt: the run finishes and rank 0 writes two losses.
inline void expect_planned_toml_trains(const std::filesystem::path& dir, const std::string& toml,
                                       int nproc) {
  std::ofstream(dir / "plan.toml") << toml;
  const auto run = run_command(
      cli() + " launch --nproc " + std::to_string(nproc) + " -- " + cli() + " train --config " +
      (dir / "plan.toml").string() + " --set data.corpus=" + (dir / "corpus.txt").string() +
      " --set train.steps=2 --set train.sample_tokens=0 --set run.threads=1 --set run.dir=" +
      (dir / "planned").string());
  ASSERT_EQ(run.exit_code, 0) << toml << run.output;
  EXPECT_EQ(rank0_losses(dir / "planned" / "metrics.jsonl").size(), 2u);
}

// What `f` throws as std::invalid_argument; "" when it returns.
inline std::string invalid_argument_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace shardtrain::testing
