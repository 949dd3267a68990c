#include "comm/launch_children.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace shardtrain::detail {
namespace {

volatile sig_atomic_t g_signal = 0;
void remember_signal(int signal) { g_signal = signal; }

// Relays complete lines (and, at end of stream, the rest) with the prefix.
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

void signal_all(std::vector<Child>& children, int signal) {
  for (auto& child : children) {
    if (child.running) kill(-child.pid, signal);
  }
}

}  // namespace

StopRequests::StopRequests(bool watch_stdin) : watch_stdin_(watch_stdin) {
  struct sigaction remember {};
  remember.sa_handler = remember_signal;
  sigemptyset(&remember.sa_mask);
  g_signal = 0;
  sigaction(SIGINT, &remember, &old_int_);
  sigaction(SIGTERM, &remember, &old_term_);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGPIPE, &ignore, &old_pipe_);
}

StopRequests::~StopRequests() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGPIPE, &old_pipe_, nullptr);
}

bool StopRequests::requested() {
  if (watch_stdin_ && !stdin_ended_) {
    pollfd fd{STDIN_FILENO, POLLIN, 0};
    if (poll(&fd, 1, 0) > 0) {
      char buffer[256];
      const ssize_t n = read(STDIN_FILENO, buffer, sizeof(buffer));
      stdin_ended_ = n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN);
    }
  }
  return g_signal != 0 || stdin_ended_;
}

std::string StopRequests::reason() const {
  if (g_signal) return "interrupted by signal " + std::to_string(g_signal);
  return "told to stop (its input ended: the launcher that started it stopped)";
}

int StopRequests::exit_code() const { return 128 + (g_signal ? g_signal : SIGHUP); }

int free_port(bool any_address) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(any_address ? INADDR_ANY : INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  close(fd);
  if (!ok) {
    throw std::runtime_error(std::string("could not find a free port: ") + std::strerror(errno));
  }
  return ntohs(addr.sin_port);
}

std::string format_seconds(std::chrono::milliseconds ms) {
  char out[32];
  std::snprintf(out, sizeof(out), "%g", static_cast<double>(ms.count()) / 1000);
  return out;
}

std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const std::string line(*entry);
    if (overrides.count(line.substr(0, line.find('='))) == 0) env.push_back(line);
  }
  for (const auto& [key, value] : overrides) env.push_back(key + "=" + value);
  return env;
}

Child spawn_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                  std::string name, std::string tag, int stdin_fd) {
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& entry : env) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);
  const std::string cannot_run = "shardtrain launch: cannot run '" + argv.at(0) + "': ";
  int pipes[2][2];
  if (pipe2(pipes[0], O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  if (pipe2(pipes[1], O_CLOEXEC) != 0) {
    const int error = errno;
    close(pipes[0][0]);
    close(pipes[0][1]);
    throw std::runtime_error(std::string("pipe: ") + std::strerror(error));
  }
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    setpgid(0, 0);
    dup2(pipes[0][1], STDOUT_FILENO);
    dup2(pipes[1][1], STDERR_FILENO);
    if (stdin_fd >= 0) dup2(stdin_fd, STDIN_FILENO);
    execvpe(args[0], args.data(), envp.data());
    // strerrordesc_np reads a static table: safe after fork in a process with threads.
    const char* reason = strerrordesc_np(errno);
    if (!reason) reason = "unknown error";
    write_all(STDERR_FILENO, cannot_run);
    [[maybe_unused]] ssize_t ignored = write(STDERR_FILENO, reason, std::strlen(reason));
    ignored = write(STDERR_FILENO, "\n", 1);
    _exit(127);
  }
  setpgid(pid, pid);
  close(pipes[0][1]);
  close(pipes[1][1]);
  Child child;
  child.pid = pid;
  child.name = std::move(name);
  child.tag = std::move(tag);
  child.running = true;
  child.streams[0] = Stream{pipes[0][0], STDOUT_FILENO, {}};
  child.streams[1] = Stream{pipes[1][0], STDERR_FILENO, {}};
  return child;
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

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "ended with wait status " + std::to_string(status);
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

int exit_code_of(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void pump(std::vector<Child>& children, int timeout_ms) {
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
    const ssize_t n = read(stream->fd, buffer, sizeof(buffer));
    if (n > 0) {
      stream->pending.append(buffer, static_cast<size_t>(n));
      relay(*stream, child->tag, false);
    } else if (n == 0 || errno != EINTR) {
      relay(*stream, child->tag, true);
      close(stream->fd);
      stream->fd = -1;
    }
  }
}

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

void stop_all(std::vector<Child>& children, std::chrono::milliseconds grace) {
  signal_all(children, SIGTERM);
  // A stopped rank (SIGSTOP, a debugger's) would hold SIGTERM until the grace ran out: continued,
  // it takes the SIGTERM now.
  signal_all(children, SIGCONT);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (any_running(children) && std::chrono::steady_clock::now() < deadline) {
    pump(children, 20);
    reap(children);
  }
  if (any_running(children)) {
    signal_all(children, SIGKILL);
    while (any_running(children)) {
      pump(children, 20);
      reap(children);
    }
  }
}

void drain(std::vector<Child>& children) {
  for (int round = 0; round < 100; ++round) {
    bool open = false;
    for (auto& child : children) {
      for (auto& stream : child.streams) open = open || stream.fd >= 0;
    }
    if (!open) return;
    pump(children, 10);
  }
  for (auto& child : children) {
    for (auto& stream : child.streams) {
      if (stream.fd >= 0) close(stream.fd);
      stream.fd = -1;
    }
  }
}

}  // namespace shardtrain::detail
