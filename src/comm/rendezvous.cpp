#include "shardtrain/rendezvous.h"

#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstring>
#include <future>
#include <iostream>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

extern char** environ;

namespace shardtrain {
namespace {

const std::string* find(const Environment& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int parse_int(const Environment& env, const std::string& key) {
  const std::string* value = find(env, key);
  if (!value) throw std::invalid_argument("environment variable " + key + " is not set");
  size_t used = 0;
  long parsed = -1;
  try {
    parsed = std::stol(*value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value->size() || parsed < 0 || parsed > (1 << 30)) {
    throw std::invalid_argument("environment variable " + key + "='" + *value +
                                "' is not a non-negative integer");
  }
  return static_cast<int>(parsed);
}

int parse_int_or(const Environment& env, const std::string& key, int fallback) {
  return find(env, key) ? parse_int(env, key) : fallback;
}

// First host of a Slurm node list: "node[03-05,07],gpu1" -> "node03".
std::string first_slurm_host(const std::string& list) {
  std::string host;
  for (size_t i = 0; i < list.size(); ++i) {
    const char c = list[i];
    if (c == ',') break;
    if (c != '[') {
      host += c;
      continue;
    }
    for (++i; i < list.size() && std::isalnum(static_cast<unsigned char>(list[i])); ++i) {
      host += list[i];
    }
    break;
  }
  return host;
}

// Slurm's "4(x2),3" form: tasks on the first node.
int first_slurm_count(const std::string& tasks) {
  try {
    return std::stoi(tasks);
  } catch (const std::exception&) {
    throw std::invalid_argument("environment variable SLURM_TASKS_PER_NODE='" + tasks +
                                "' does not start with a task count");
  }
}

bool is_loopback(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    return IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
           (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) && in6->sin6_addr.s6_addr[12] == 127);
  }
  return false;
}

std::string numeric_host(const sockaddr* addr, socklen_t len) {
  char text[NI_MAXHOST] = {};
  if (getnameinfo(addr, len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) return "";
  return text;
}

// Calls fn(address, length) for each address `host` resolves to; false when it does not.
template <typename F>
bool for_each_address(const std::string& host, F&& fn) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || !found) return false;
  for (addrinfo* a = found; a; a = a->ai_next) {
    if (fn(a->ai_addr, a->ai_addrlen)) break;
  }
  freeaddrinfo(found);
  return true;
}

// The local address the kernel sends from to reach `host` (a UDP connect sends nothing).
std::string route_source_address(const std::string& host, int port) {
  std::string source;
  for_each_address(host, [&](const sockaddr* addr, socklen_t len) {
    sockaddr_storage target{};
    std::memcpy(&target, addr, len);
    const uint16_t port_bytes = htons(static_cast<uint16_t>(port));
    if (addr->sa_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(&target)->sin6_port = port_bytes;
    } else {
      reinterpret_cast<sockaddr_in*>(&target)->sin_port = port_bytes;
    }
    const int fd = socket(addr->sa_family, SOCK_DGRAM, 0);
    if (fd < 0) return false;
    sockaddr_storage local{};
    socklen_t local_len = sizeof(local);
    if (connect(fd, reinterpret_cast<sockaddr*>(&target), len) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0) {
      source = numeric_host(reinterpret_cast<sockaddr*>(&local), local_len);
    }
    close(fd);
    return !source.empty();
  });
  return source;
}

}  // namespace

TransportAddress transport_address(const std::string& master_addr, int master_port) {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  const std::string hostname = name;
  bool master_loopback = false;
  const bool master_resolves = for_each_address(master_addr, [&](const sockaddr* a, socklen_t) {
    master_loopback = is_loopback(a);
    return true;
  });
  if (master_loopback || !master_resolves) return {"127.0.0.1", ""};
  // Gloo binds the first address a name resolves to: give it the first that is not loopback.
  std::string routable;
  for_each_address(hostname, [&](const sockaddr* a, socklen_t len) {
    if (!is_loopback(a)) routable = numeric_host(a, len);
    return !routable.empty();
  });
  if (!routable.empty()) return {routable, ""};
  const std::string source = route_source_address(master_addr, master_port);
  if (source.empty()) return {hostname, ""};  // Gloo's own error will name the hostname
  return {source, "hostname '" + hostname +
                      "' resolves to a loopback address, so this node's ranks use " + source +
                      ", its address on the route to MASTER_ADDR " + master_addr +
                      " (GLOO_SOCKET_IFNAME or shardtrain launch --iface picks an interface)"};
}

Environment current_environment() {
  Environment env;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string line(*entry);
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

// The variables each launcher sets, in order of precedence. Slurm's local world size is not a
// plain variable; it is read from SLURM_TASKS_PER_NODE below.
struct LauncherKeys {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};
constexpr LauncherKeys kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

RendezvousInfo rendezvous_info(const Environment& env) {
  RendezvousInfo info;
  const LauncherKeys* keys = nullptr;
  for (const auto& launcher : kLaunchers) {
    if (find(env, launcher.rank) || find(env, launcher.size)) {
      keys = &launcher;
      break;
    }
  }
  info.restart_count = parse_int_or(env, "TORCHELASTIC_RESTART_COUNT", 0);
  if (!keys) return info;  // no launcher: one process
  info.source = keys->source;
  info.rank = parse_int(env, keys->rank);
  info.world_size = parse_int(env, keys->size);
  info.local_rank = parse_int_or(env, keys->local_rank, info.source == "slurm" ? 0 : info.rank);
  const std::string* tasks = find(env, "SLURM_TASKS_PER_NODE");
  if (info.source == "slurm" && tasks) {
    info.local_world_size = first_slurm_count(*tasks);
  } else {
    info.local_world_size = parse_int_or(env, keys->local_size, info.world_size);
  }
  const std::string rank_key = keys->rank;
  const std::string size_key = keys->size;

  if (info.world_size < 1) throw std::invalid_argument(size_key + " must be at least 1");
  if (info.rank >= info.world_size) {
    throw std::invalid_argument(rank_key + "=" + std::to_string(info.rank) + " is not below " +
                                size_key + "=" + std::to_string(info.world_size));
  }
  if (info.local_rank >= info.local_world_size) {
    throw std::invalid_argument("local rank " + std::to_string(info.local_rank) +
                                " is not below the local world size " +
                                std::to_string(info.local_world_size));
  }
  if (const std::string* addr = find(env, "MASTER_ADDR")) {
    info.master_addr = *addr;
  } else if (info.source == "slurm" && find(env, "SLURM_JOB_NODELIST")) {
    info.master_addr = first_slurm_host(*find(env, "SLURM_JOB_NODELIST"));
  } else if (info.world_size > 1) {
    throw std::invalid_argument("environment variable MASTER_ADDR is not set (" + size_key + "=" +
                                std::to_string(info.world_size) + " needs the address of rank 0)");
  }
  info.master_port = parse_int_or(env, "MASTER_PORT", 29500);
  if (info.master_port < 1 || info.master_port > 65535) {
    throw std::invalid_argument("MASTER_PORT=" + std::to_string(info.master_port) +
                                " is not a TCP port (1-65535)");
  }
  return info;
}

std::shared_ptr<ProcessGroup> init_from_environment(ProcessGroupOptions options) {
  const Environment env = current_environment();
  if (options.interface_.empty()) {
    if (const std::string* iface = find(env, "GLOO_SOCKET_IFNAME")) options.interface(*iface);
  }
  return init_from_environment(rendezvous_info(env), std::move(options));
}

std::shared_ptr<ProcessGroup> init_from_environment(const RendezvousInfo& info,
                                                    ProcessGroupOptions options) {
  options.ranks_per_node(info.local_world_size);
  if (options.hostname_.empty() && options.interface_.empty() && info.world_size > 1) {
    const TransportAddress chosen = transport_address(info.master_addr, info.master_port);
    options.hostname(chosen.hostname);
    // Once per node: which address its ranks use, when it is not the one the hostname names.
    if (!chosen.reason.empty() && info.local_rank == 0) {
      std::cerr << "shardtrain: " << chosen.reason << "\n";
    }
  }
  // c10d's store client waits for an answer with no timeout of its own: a port that takes the
  // connection and never answers (another service on MASTER_PORT) would hold this rank forever.
  // The first contact and the rendezvous run on a thread of their own, waited for at most the
  // timeout and a grace; past it this rank gives up, and that thread is left waiting (the
  // process ends with the error).
  auto rendezvous =
      std::make_shared<std::packaged_task<std::shared_ptr<ProcessGroup>()>>([info, options] {
        c10d::TCPStoreOptions store_options;
        store_options.port = static_cast<uint16_t>(info.master_port);
        store_options.isServer = info.rank == 0;
        store_options.numWorkers = info.world_size;
        store_options.waitWorkers = false;  // wait_for_members names the ranks that are missing
        store_options.timeout = options.timeout_;
        c10::intrusive_ptr<c10d::Store> store;
        try {
          store = c10::make_intrusive<c10d::TCPStore>(info.master_addr, store_options);
        } catch (const std::exception& e) {
          // LibTorch 2.x's c10::Error::what() carries its C++ stack; the message needs one line.
          const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
          const char* why = torch_error ? torch_error->what_without_backtrace() : e.what();
          throw std::runtime_error(
              std::string(info.rank == 0
                              ? "rank 0 could not host"
                              : "rank " + std::to_string(info.rank) + " could not reach") +
              " the rendezvous store at " + info.master_addr + ":" +
              std::to_string(info.master_port) + (info.rank == 0 ? "" : " (is rank 0 running?)") +
              ": " + why);
        }
        return init_process_group(std::move(store), info.rank, info.world_size, options);
      });
  std::future<std::shared_ptr<ProcessGroup>> joined = rendezvous->get_future();
  std::thread([rendezvous] { (*rendezvous)(); }).detach();
  const auto limit = options.timeout_ + std::chrono::seconds(5);
  if (joined.wait_for(limit) != std::future_status::ready) {
    throw std::runtime_error(
        "rank " + std::to_string(info.rank) + ": the rendezvous store at " + info.master_addr +
        ":" + std::to_string(info.master_port) + " did not answer within " +
        std::to_string(std::chrono::duration_cast<std::chrono::seconds>(limit).count()) +
        " s (the timeout and 5 s): is another service listening on MASTER_PORT " +
        std::to_string(info.master_port) + "? Rank 0 hosts the store there");
  }
  return joined.get();
}

}  // namespace shardtrain
