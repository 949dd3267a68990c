#include "shardtrain/launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace shardtrain {
namespace {

struct Stream {
  int fd = -1;
  int out_fd = STDOUT_FILENO;
  std::string pending;  // bytes of a line not yet ended
};

struct Child {
  pid_t pid = -1;
  int rank = 0;
  bool running = false;
  int status = 0;
  Stream streams[2];
};

volatile sig_atomic_t g_forwarded_signal = 0;
void remember_signal(int signal) { g_forwarded_signal = signal; }

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error(std::string("could not find a free port: ") + std::strerror(errno));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// Relays complete lines (and, at end of stream, the rest) with the rank prefix.
void relay(Stream& stream, const std::string& prefix, bool flush_all) {
  size_t start = 0;
  for (size_t nl; (nl = stream.pending.find('\n', start)) != std::string::npos; start = nl + 1) {
    write_all(stream.out_fd, prefix + stream.pending.substr(start, nl + 1 - start));
  }
  stream.pending.erase(0, start);
  if (flush_all && !stream.pending.empty()) {
    write_all(stream.out_fd, prefix + stream.pending + "\n");
    stream.pending.clear();
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// Threads each of `nproc` ranks can have without the ranks oversubscribing the cores this
// launcher may run on.
int threads_per_rank(int nproc) {
  cpu_set_t cores;
  const int available = sched_getaffinity(0, sizeof cores, &cores) == 0
                            ? CPU_COUNT(&cores)
                            : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, available / nproc);
}

Child spawn(const LaunchOptions& o, int local_rank, int port, int attempt,
            const std::vector<std::string>& command) {
  const std::string rank_threads = std::to_string(threads_per_rank(o.nproc_));
  int pipes[2][2];
  for (auto& p : pipes) {
    if (pipe2(p, O_CLOEXEC) != 0) {
      throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    }
  }
  Child child;
  child.rank = o.node_rank_ * o.nproc_ + local_rank;
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);  // its own process group, so stopping it reaches its children too
    dup2(pipes[0][1], STDOUT_FILENO);
    dup2(pipes[1][1], STDERR_FILENO);
    const int world = o.nnodes_ * o.nproc_;
    setenv("RANK", std::to_string(child.rank).c_str(), 1);
    setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
    setenv("LOCAL_RANK", std::to_string(local_rank).c_str(), 1);
    setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc_).c_str(), 1);
    setenv("GROUP_RANK", std::to_string(o.node_rank_).c_str(), 1);
    setenv("MASTER_ADDR", o.master_addr_.c_str(), 1);
    setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    // torchrun's names: a restarted trainer resumes from its latest checkpoint.
    setenv("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt).c_str(), 1);
    setenv("TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts_).c_str(), 1);
    // Unless the user chose, the ranks share the cores instead of each taking all of them
    // (LibTorch's intra-op pool and OpenBLAS both read this).
    if (o.nproc_ > 1) setenv("OMP_NUM_THREADS", rank_threads.c_str(), 0);
    std::vector<char*> argv;
    for (const auto& arg : command) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    const std::string message =
        "shardtrain launch: cannot run '" + command[0] + "': " + std::strerror(errno) + "\n";
    write_all(STDERR_FILENO, message);
    _exit(127);
  }
  setpgid(pid, pid);
  child.pid = pid;
  child.running = true;
  close(pipes[0][1]);
  close(pipes[1][1]);
  child.streams[0] = Stream{pipes[0][0], STDOUT_FILENO, {}};
  child.streams[1] = Stream{pipes[1][0], STDERR_FILENO, {}};
  return child;
}

// Reads what is available from every open stream, waiting at most timeout_ms.
void pump(std::vector<Child>& children, bool prefix, int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Child*, Stream*>> owners;
  for (auto& child : children) {
    for (auto& stream : child.streams) {
      if (stream.fd >= 0) {
        fds.push_back(pollfd{stream.fd, POLLIN, 0});
        owners.emplace_back(&child, &stream);
      }
    }
  }
  if (fds.empty()) {
    if (timeout_ms > 0) usleep(timeout_ms * 1000);
    return;
  }
  if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
  char buffer[65536];
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    auto [child, stream] = owners[i];
    const std::string tag = prefix ? "[rank " + std::to_string(child->rank) + "] " : "";
    const ssize_t n = read(stream->fd, buffer, sizeof(buffer));
    if (n > 0) {
      stream->pending.append(buffer, static_cast<size_t>(n));
      relay(*stream, tag, false);
    } else if (n == 0 || errno != EINTR) {
      relay(*stream, tag, true);
      close(stream->fd);
      stream->fd = -1;
    }
  }
}

// Collects exited children; returns the index of the first that failed in this call, or -1.
int reap(std::vector<Child>& children) {
  int first_failure = -1;
  for (size_t i = 0; i < children.size(); ++i) {
    Child& child = children[i];
    if (!child.running) continue;
    int status = 0;
    if (waitpid(child.pid, &status, WNOHANG) == child.pid) {
      child.running = false;
      child.status = status;
      if (failed(status) && first_failure < 0) first_failure = static_cast<int>(i);
    }
  }
  return first_failure;
}

bool any_running(const std::vector<Child>& children) {
  for (const auto& child : children) {
    if (child.running) return true;
  }
  return false;
}

void signal_all(std::vector<Child>& children, int signal) {
  for (auto& child : children) {
    if (child.running) kill(-child.pid, signal);
  }
}

// SIGTERM now, SIGKILL after the timeout; output keeps flowing meanwhile.
void stop_all(std::vector<Child>& children, const LaunchOptions& o) {
  signal_all(children, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + o.kill_timeout_;
  while (any_running(children) && std::chrono::steady_clock::now() < deadline) {
    pump(children, o.prefix_output_, 20);
    reap(children);
  }
  if (any_running(children)) {
    signal_all(children, SIGKILL);
    while (any_running(children)) {
      pump(children, o.prefix_output_, 20);
      reap(children);
    }
  }
}

void drain(std::vector<Child>& children, bool prefix) {
  for (int round = 0; round < 100; ++round) {
    bool open = false;
    for (auto& child : children) {
      for (auto& stream : child.streams) open = open || stream.fd >= 0;
    }
    if (!open) return;
    pump(children, prefix, 10);
  }
  for (auto& child : children) {
    for (auto& stream : child.streams) {
      if (stream.fd >= 0) close(stream.fd);
      stream.fd = -1;
    }
  }
}

void validate(const LaunchOptions& o, const std::vector<std::string>& command) {
  if (command.empty()) throw std::invalid_argument("no program to launch (give it after --)");
  if (o.nproc_ < 1) throw std::invalid_argument("--nproc must be at least 1");
  if (o.nnodes_ < 1) throw std::invalid_argument("--nnodes must be at least 1");
  if (o.node_rank_ < 0 || o.node_rank_ >= o.nnodes_) {
    throw std::invalid_argument("--node-rank " + std::to_string(o.node_rank_) +
                                " is not below --nnodes " + std::to_string(o.nnodes_));
  }
  if (o.nnodes_ > 1 && o.master_port_ == 0) {
    throw std::invalid_argument("--master-port is required with --nnodes > 1");
  }
  if (o.master_port_ < 0 || o.master_port_ > 65535) {
    throw std::invalid_argument("--master-port " + std::to_string(o.master_port_) +
                                " is not a TCP port");
  }
  if (o.max_restarts_ < 0) throw std::invalid_argument("--max-restarts must be >= 0");
}

}  // namespace

LaunchResult launch(const LaunchOptions& options, const std::vector<std::string>& command) {
  validate(options, command);
  struct sigaction forward {};
  forward.sa_handler = remember_signal;
  sigemptyset(&forward.sa_mask);
  struct sigaction old_int {
  }, old_term{};
  sigaction(SIGINT, &forward, &old_int);
  sigaction(SIGTERM, &forward, &old_term);
  g_forwarded_signal = 0;

  LaunchResult result;
  for (int attempt = 0;; ++attempt) {
    const int port = options.master_port_ ? options.master_port_ : free_port();
    std::vector<Child> children;
    for (int local = 0; local < options.nproc_; ++local) {
      children.push_back(spawn(options, local, port, attempt, command));
    }
    int failure = -1;
    while (any_running(children) && failure < 0 && !g_forwarded_signal) {
      pump(children, options.prefix_output_, 50);
      failure = reap(children);
    }
    if (failure >= 0 || g_forwarded_signal) stop_all(children, options);
    drain(children, options.prefix_output_);
    if (g_forwarded_signal) {
      result.exit_code = 128 + g_forwarded_signal;
      result.message =
          "interrupted by signal " + std::to_string(g_forwarded_signal) + "; stopped all ranks";
      break;
    }
    if (failure < 0) {
      result = LaunchResult{0, -1, attempt, ""};
      break;
    }
    const Child& failed_child = children[failure];
    result.failed_rank = failed_child.rank;
    result.restarts = attempt;
    result.exit_code = WIFEXITED(failed_child.status) ? WEXITSTATUS(failed_child.status)
                                                      : 128 + WTERMSIG(failed_child.status);
    result.message = "rank " + std::to_string(failed_child.rank) + " (pid " +
                     std::to_string(failed_child.pid) + ") " +
                     describe_status(failed_child.status) + "; stopped the other ranks";
    if (attempt >= options.max_restarts_) {
      if (options.max_restarts_ > 0) {
        result.message += " (after " + std::to_string(attempt) + " restarts)";
      }
      break;
    }
    if (result.exit_code == 2) {
      // Status 2 is bad input (a config key, a file, a flag): the same command fails again.
      result.message += "; not restarted: status 2 is bad input, which a restart cannot mend";
      break;
    }
    const std::string note = "shardtrain launch: " + result.message + "; restarting (" +
                             std::to_string(attempt + 1) + " of " +
                             std::to_string(options.max_restarts_) + ")\n";
    write_all(STDERR_FILENO, note);
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

}  // namespace shardtrain
