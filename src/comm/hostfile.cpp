// `shardtrain launch --hostfile`: one launcher per host, started over the user's ssh.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "comm/launch_children.h"
#include "shardtrain/launch.h"

extern char** environ;

namespace shardtrain {
namespace {

// "host1@host2:0,2" -> {host1: {}, host2: {0, 2}} (an empty list: the whole host).
std::map<std::string, std::vector<int>> parse_selection(const std::string& text,
                                                        const std::string& flag) {
  std::map<std::string, std::vector<int>> selected;
  std::stringstream hosts(text);
  for (std::string item; std::getline(hosts, item, '@');) {
    const size_t colon = item.find(':');
    const std::string host = item.substr(0, colon);
    if (host.empty()) throw std::invalid_argument(flag + " '" + text + "' names an empty host");
    auto& slots = selected[host];
    if (colon == std::string::npos) continue;
    std::stringstream list(item.substr(colon + 1));
    for (std::string slot; std::getline(list, slot, ',');) {
      size_t used = 0;
      int value = -1;
      try {
        value = std::stoi(slot, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != slot.size() || value < 0) {
        throw std::invalid_argument(flag + " '" + text + "': slot '" + slot + "' of host '" + host +
                                    "' is not a slot index");
      }
      slots.push_back(value);
    }
  }
  return selected;
}

// The variables a remote launcher gets from this one: the project's and the transports' own,
// thread counts, and where programs and libraries are found.
bool forwarded(const std::string& key) {
  for (const char* prefix : {"SHARDTRAIN_", "GLOO_", "NCCL_", "OMP_", "CUDA_", "TORCH_"}) {
    if (key.rfind(prefix, 0) == 0) return true;
  }
  return key == "PATH" || key == "LD_LIBRARY_PATH";
}

std::string remote_command(const LaunchOptions& o, int node, const HostSlots& host, int nnodes,
                           const std::vector<std::string>& command) {
  std::string line =
      "cd " + shell_quoted(std::filesystem::current_path().string()) + " && exec env";
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string text(*entry);
    if (forwarded(text.substr(0, text.find('=')))) line += " " + shell_quoted(text);
  }
  // Slots chosen by --include/--exclude (or fewer than all by --nproc) are the devices of a
  // CUDA host, as DeepSpeed's launcher sets them.
  if (host.slots.size() != static_cast<size_t>(o.nproc_) || host.slots.back() + 1 != o.nproc_) {
    std::string devices;
    for (int i = 0; i < o.nproc_; ++i) {
      devices += (i ? "," : "") + std::to_string(host.slots[i]);
    }
    line += " CUDA_VISIBLE_DEVICES=" + devices;
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  line += " " + shell_quoted(self) + " launch --nproc " + std::to_string(o.nproc_) + " --nnodes " +
          std::to_string(nnodes) + " --node-rank " + std::to_string(node) + " --master-addr " +
          shell_quoted(o.master_addr_) + " --master-port " + std::to_string(o.master_port_) +
          " --max-restarts " + std::to_string(o.max_restarts_) + " --kill-timeout " +
          detail::format_seconds(o.kill_timeout_) + " --label " + shell_quoted(host.host) +
          " --stop-on-stdin-eof";
  if (o.fault_tolerance_) line += " --fault-tolerance";
  if (!o.interface_.empty()) line += " --iface " + shell_quoted(o.interface_);
  if (!o.prefix_output_) line += " --no-prefix";
  line += " --";
  for (const auto& word : command) line += " " + shell_quoted(word);
  return line;
}

}  // namespace

std::string shell_quoted(const std::string& word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::vector<HostSlots> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read hostfile '" + path + "'");
  std::vector<HostSlots> hosts;
  std::map<std::string, int> line_of;
  int number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    line = line.substr(0, line.find('#'));
    std::stringstream words(line);
    std::string host, slots, extra;
    if (!(words >> host)) continue;  // blank or comment
    const std::string where = "hostfile '" + path + "' line " + std::to_string(number);
    int count = -1;
    if (words >> slots && !(words >> extra) && slots.rfind("slots=", 0) == 0) {
      size_t used = 0;
      try {
        count = std::stoi(slots.substr(6), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != slots.size() - 6) count = -1;
    }
    if (count < 1) {
      throw std::invalid_argument(where + ": expected 'HOST slots=N' with N >= 1, got '" + line +
                                  "'");
    }
    if (line_of.count(host)) {
      throw std::invalid_argument(where + ": host '" + host + "' is listed twice (first on line " +
                                  std::to_string(line_of[host]) + ")");
    }
    line_of[host] = number;
    HostSlots entry{host, {}};
    for (int slot = 0; slot < count; ++slot) entry.slots.push_back(slot);
    hosts.push_back(std::move(entry));
  }
  if (hosts.empty()) throw std::invalid_argument("hostfile '" + path + "' lists no host");
  return hosts;
}

std::vector<HostSlots> select_hosts(std::vector<HostSlots> hosts, const std::string& include,
                                    const std::string& exclude) {
  if (!include.empty() && !exclude.empty()) {
    throw std::invalid_argument("--include and --exclude cannot be given together");
  }
  const bool including = !include.empty();
  if (!including && exclude.empty()) return hosts;
  const std::string flag = including ? "--include" : "--exclude";
  const auto selection = parse_selection(including ? include : exclude, flag);
  for (const auto& [name, slots] : selection) {
    auto host = std::find_if(hosts.begin(), hosts.end(),
                             [&name = name](const HostSlots& h) { return h.host == name; });
    if (host == hosts.end()) {
      throw std::invalid_argument(flag + " names host '" + name + "', which the hostfile lacks");
    }
    for (int slot : slots) {
      if (slot >= static_cast<int>(host->slots.size())) {
        throw std::invalid_argument(flag + " names slot " + std::to_string(slot) + " of host '" +
                                    name + "', which has " + std::to_string(host->slots.size()) +
                                    " slot(s)");
      }
    }
  }
  std::vector<HostSlots> kept;
  for (auto& host : hosts) {
    const auto chosen = selection.find(host.host);
    const bool listed = chosen != selection.end();
    if (including && !listed) continue;
    if (!including && listed && chosen->second.empty()) continue;
    if (listed && !chosen->second.empty()) {
      std::vector<int> slots;
      for (int slot : host.slots) {
        const bool named = std::count(chosen->second.begin(), chosen->second.end(), slot) > 0;
        if (named == including) slots.push_back(slot);
      }
      host.slots = slots;
    }
    if (!host.slots.empty()) kept.push_back(std::move(host));
  }
  if (kept.empty()) throw std::invalid_argument(flag + " leaves no slot to run on");
  return kept;
}

LaunchResult launch_hosts(const HostfileLaunch& plan, LaunchOptions o,
                          const std::vector<std::string>& command) {
  if (command.empty()) throw std::invalid_argument("no program to launch (give it after --)");
  if (plan.hosts.empty()) throw std::invalid_argument("no host to launch on");
  const int nnodes = static_cast<int>(plan.hosts.size());
  if (o.nproc_ == 0) {
    for (const auto& host : plan.hosts) {
      if (host.slots.size() != plan.hosts[0].slots.size()) {
        throw std::invalid_argument(
            "host '" + plan.hosts[0].host + "' has " + std::to_string(plan.hosts[0].slots.size()) +
            " slot(s) but host '" + host.host + "' has " + std::to_string(host.slots.size()) +
            ": every node runs the same number of ranks (--nproc N uses N slots of each)");
      }
    }
    o.nproc_ = static_cast<int>(plan.hosts[0].slots.size());
  }
  for (const auto& host : plan.hosts) {
    if (static_cast<int>(host.slots.size()) < o.nproc_) {
      throw std::invalid_argument("--nproc " + std::to_string(o.nproc_) + " is more than the " +
                                  std::to_string(host.slots.size()) + " slot(s) of host '" +
                                  host.host + "'");
    }
  }
  if (o.master_addr_.empty()) o.master_addr_ = plan.hosts[0].host;
  if (o.master_port_ == 0) o.master_port_ = 29500;

  detail::StopRequests stop(false);
  // Each host's launcher reads its input from a pipe this launcher holds: closing it tells the
  // host to stop.
  std::vector<detail::Child> hosts;
  std::vector<int> inputs;
  const auto env = detail::environment_with({});
  for (int node = 0; node < nnodes; ++node) {
    const HostSlots& host = plan.hosts[node];
    int input[2];
    if (pipe2(input, O_CLOEXEC) != 0) {
      for (int fd : inputs) close(fd);
      detail::stop_all(hosts, o.kill_timeout_);
      throw std::runtime_error("pipe failed");
    }
    const std::vector<std::string> argv = {
        "/bin/sh", "-c",      plan.ssh + " \"$@\"",
        "sh",      host.host, remote_command(o, node, host, nnodes, command)};
    hosts.push_back(detail::spawn_child(
        argv, env, "host " + host.host + " (node " + std::to_string(node) + ")", "", input[0]));
    close(input[0]);
    inputs.push_back(input[1]);
  }
  int failure = -1;
  bool stopped = false;
  while (detail::any_running(hosts) && failure < 0 && !stopped) {
    detail::pump(hosts, 50);
    failure = detail::reap(hosts);
    stopped = failure < 0 && stop.requested();
  }
  // Every host stops its ranks (SIGTERM, then SIGKILL after the kill timeout); ssh sessions
  // still open after that and a margin are ended here.
  for (int& fd : inputs) close(fd);
  const auto deadline =
      std::chrono::steady_clock::now() + o.kill_timeout_ + std::chrono::seconds(15);
  while (detail::any_running(hosts) && std::chrono::steady_clock::now() < deadline) {
    detail::pump(hosts, 50);
    const int late = detail::reap(hosts);
    if (failure < 0 && !stopped) failure = late;
  }
  detail::stop_all(hosts, std::chrono::seconds(2));
  detail::drain(hosts);

  LaunchResult result;
  if (stopped) {
    result.exit_code = stop.exit_code();
    result.message = stop.reason() + "; stopped the ranks of every host";
  } else if (failure >= 0) {
    const detail::Child& host = hosts[failure];
    result.exit_code = detail::exit_code_of(host.status);
    result.message =
        "the launcher of " + host.name + " " + detail::describe_status(host.status) +
        (result.exit_code == 255 ? " (ssh's status when the host cannot be reached)" : "") +
        "; stopped the ranks of every host";
  }
  return result;
}

}  // namespace shardtrain
