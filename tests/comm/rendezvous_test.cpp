#include "shardtrain/rendezvous.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "support.h"

namespace shardtrain {
namespace rendezvous_test {

std::string error_of(const Environment& env) {
  try {
    rendezvous_info(env);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(RendezvousTest, ReadsTorchrunVariables) {
  const auto info = rendezvous_info({{"RANK", "3"},
                                     {"WORLD_SIZE", "8"},
                                     {"LOCAL_RANK", "1"},
                                     {"LOCAL_WORLD_SIZE", "2"},
                                     {"MASTER_ADDR", "node7"},
                                     {"MASTER_PORT", "1234"}});
  EXPECT_EQ(info.source, "torchrun");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_addr, "node7");
  EXPECT_EQ(info.master_port, 1234);
}

TEST(RendezvousTest, ReadsOpenMpiVariables) {
  const auto info = rendezvous_info({{"OMPI_COMM_WORLD_RANK", "2"},
                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                     {"MASTER_ADDR", "10.0.0.1"}});
  EXPECT_EQ(info.source, "openmpi");
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.master_port, 29500);
}

TEST(RendezvousTest, ReadsSlurmVariablesAndTheFirstNode) {
  const auto info = rendezvous_info({{"SLURM_PROCID", "5"},
                                     {"SLURM_NTASKS", "8"},
                                     {"SLURM_LOCALID", "1"},
                                     {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                     {"SLURM_JOB_NODELIST", "gpu[07-08,11],login1"}});
  EXPECT_EQ(info.source, "slurm");
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.master_addr, "gpu07");
}

TEST(RendezvousTest, NoLauncherMeansOneProcess) {
  const auto info = rendezvous_info({{"HOME", "/root"}});
  EXPECT_EQ(info.source, "single");
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.rank, 0);
}

TEST(RendezvousTest, ReadsWhichRestartThisIs) {
  EXPECT_EQ(rendezvous_info({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).restart_count, 0);
  EXPECT_EQ(
      rendezvous_info({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_RESTART_COUNT", "2"}})
          .restart_count,
      2);
  // A launcher that restarts one process sets the count without the rank variables.
  EXPECT_EQ(rendezvous_info({{"TORCHELASTIC_RESTART_COUNT", "1"}}).restart_count, 1);
  const std::string bad = error_of({{"TORCHELASTIC_RESTART_COUNT", "-1"}});
  EXPECT_NE(bad.find("TORCHELASTIC_RESTART_COUNT='-1' is not a non-negative integer"),
            std::string::npos)
      << bad;
}

TEST(RendezvousTest, InconsistentEnvironmentIsNamed) {
  const std::string too_big = error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}});
  EXPECT_NE(too_big.find("RANK=4 is not below WORLD_SIZE=4"), std::string::npos) << too_big;

  const std::string no_addr = error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_NE(no_addr.find("MASTER_ADDR is not set"), std::string::npos) << no_addr;

  const std::string no_size = error_of({{"RANK", "0"}});
  EXPECT_NE(no_size.find("WORLD_SIZE is not set"), std::string::npos) << no_size;

  const std::string bad = error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}});
  EXPECT_NE(bad.find("RANK='x' is not a non-negative integer"), std::string::npos) << bad;

  const std::string port =
      error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}});
  EXPECT_NE(port.find("MASTER_PORT=0"), std::string::npos) << port;

  const std::string local = error_of({{"RANK", "1"},
                                      {"WORLD_SIZE", "2"},
                                      {"LOCAL_RANK", "2"},
                                      {"LOCAL_WORLD_SIZE", "2"},
                                      {"MASTER_ADDR", "h"}});
  EXPECT_NE(local.find("local rank 2"), std::string::npos) << local;
}

TEST(RendezvousTest, RanksMeetOverTheTcpStore) {
  // Two ranks as threads, connected exactly as launched processes are: TCP store on rank 0.
  RendezvousInfo info;
  info.world_size = 2;
  info.local_world_size = 2;
  info.master_addr = "127.0.0.1";
  info.master_port = testing::free_port();
  std::vector<float> results(2);
  std::vector<int> per_node(2), per_node_of_subgroup(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        RendezvousInfo mine = info;
        mine.rank = mine.local_rank = rank;
        auto group =
            init_from_environment(mine, ProcessGroupOptions().timeout(std::chrono::seconds(30)));
        at::Tensor t = at::full({3}, rank + 1.0f);
        group->all_reduce(t)->wait();
        results[rank] = t[0].item<float>();
        // The launcher's ranks per node reach the world group and the groups split from it.
        per_node[rank] = group->ranks_per_node();
        per_node_of_subgroup[rank] = group->new_group({1, 0})->ranks_per_node();
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_EQ(results[0], 3.0f);
  EXPECT_EQ(results[1], 3.0f);
  EXPECT_EQ(per_node, std::vector<int>({2, 2}));
  EXPECT_EQ(per_node_of_subgroup, std::vector<int>({2, 2}));
}

TEST(RendezvousTest, AStoreThatNeverAnswersIsNamedWithinTheTimeout) {
  // Something other than a rendezvous store on MASTER_PORT: it takes connections and never
  // answers.
  const int server = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(server, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ASSERT_EQ(::bind(server, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::listen(server, 8), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::getsockname(server, reinterpret_cast<sockaddr*>(&address), &length), 0);
  std::vector<int> accepted;
  std::thread taker([&] {
    for (int i = 0; i < 2; ++i) {
      const int fd = ::accept(server, nullptr, nullptr);
      if (fd < 0) return;
      accepted.push_back(fd);
    }
  });
  RendezvousInfo info;
  info.rank = info.local_rank = 1;
  info.world_size = info.local_world_size = 2;
  info.master_addr = "127.0.0.1";
  info.master_port = ntohs(address.sin_port);
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    init_from_environment(info, ProcessGroupOptions().timeout(std::chrono::seconds(2)));
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(error.find("rank 1: the rendezvous store at 127.0.0.1:" +
                       std::to_string(info.master_port) + " did not answer within 7 s"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("is another service listening on MASTER_PORT"), std::string::npos) << error;
  EXPECT_LT(waited, 12.0);
  // Closing the connections ends the store client still waiting on them.
  ::shutdown(server, SHUT_RDWR);
  ::close(server);
  taker.join();
  for (int fd : accepted) ::close(fd);
}

// With a loopback master the transport stays on loopback. With a master elsewhere it uses the
// hostname, unless the hostname resolves only to loopback (most containers): then the local
// address of the route to the master, which here is this machine's own non-loopback address.
TEST(RendezvousTest, TransportAddressFollowsTheRouteWhenTheHostnameIsLoopback) {
  EXPECT_EQ(transport_address("127.0.0.1", 29500).hostname, "127.0.0.1");
  EXPECT_EQ(transport_address("localhost", 29500).hostname, "127.0.0.1");
  std::string own;
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  for (ifaddrs* a = list; a && own.empty(); a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_LOOPBACK)) {
      continue;
    }
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    own = text;
  }
  freeifaddrs(list);
  if (own.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address";
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string hostname_address;  // the first non-loopback IPv4 address of the hostname
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &found) == 0) {
    for (addrinfo* a = found; a && hostname_address.empty(); a = a->ai_next) {
      const auto* in = reinterpret_cast<sockaddr_in*>(a->ai_addr);
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
      if ((ntohl(in->sin_addr.s_addr) >> 24) != 127) hostname_address = text;
    }
    freeaddrinfo(found);
  }
  const auto chosen = transport_address(own, 29500);
  if (!hostname_address.empty()) {
    // The hostname's first address that is not loopback (IPv6 may come first).
    EXPECT_NE(chosen.hostname.rfind("127.", 0), 0u) << chosen.hostname;
    EXPECT_NE(chosen.hostname, "::1");
    EXPECT_EQ(chosen.reason, "");
  } else {
    EXPECT_EQ(chosen.hostname, own);
    EXPECT_NE(chosen.reason.find("resolves to a loopback address"), std::string::npos)
        << chosen.reason;
    EXPECT_NE(chosen.reason.find("route to MASTER_ADDR " + own), std::string::npos)
        << chosen.reason;
  }
}

}  // namespace rendezvous_test
}  // namespace shardtrain
