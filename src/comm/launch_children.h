// Child processes a launcher supervises: their output relayed line by line with a prefix,
// their exits collected, and all of them stopped together.
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "shardtrain/launch.h"

namespace shardtrain::detail {

struct Stream {
  int fd = -1;
  int out_fd = STDOUT_FILENO;
  std::string pending;  // bytes of a line not yet ended
};

struct Child {
  pid_t pid = -1;
  std::string name;  // "rank 3" or "host node1": how messages name it
  std::string tag;   // the prefix of each relayed line
  bool running = false;
  int status = 0;
  Stream streams[2];
};

// This process's environment with `overrides` applied, as KEY=VALUE entries.
std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides);

// Forks `argv` (searched in PATH) with environment `env`, in a process group of its own (so
// stopping it reaches its children too), stdout and stderr read through pipes, stdin from
// `stdin_fd` (inherited when -1). Everything the child needs is built before the fork: the
// launcher may have threads (a rendezvous store's).
Child spawn_child(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                  std::string name, std::string tag, int stdin_fd);

// While it lives: SIGINT and SIGTERM are remembered instead of ending the launcher, and SIGPIPE
// is ignored (a launcher started over ssh keeps stopping its ranks after the session closed).
// With `watch_stdin`, the end of stdin counts as a request to stop too.
class StopRequests {
 public:
  explicit StopRequests(bool watch_stdin);
  ~StopRequests();
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;
  // Whether a stop was asked for (a signal, or the end of stdin); checking reads stdin.
  bool requested();
  // What asked, and the launcher's exit status for it.
  std::string reason() const;
  int exit_code() const;

 private:
  bool watch_stdin_;
  bool stdin_ended_ = false;
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
  struct sigaction old_pipe_ {};
};

// A TCP port nothing listens on right now, on loopback or on every address of this host.
int free_port(bool any_address);
// "2.5" for 2500 ms.
std::string format_seconds(std::chrono::milliseconds ms);

void write_all(int fd, const std::string& text);
std::string describe_status(int status);
bool failed(int status);
// The launcher's exit status for a child that ended with `status`.
int exit_code_of(int status);

// Reads what is available from every open stream, waiting at most timeout_ms.
void pump(std::vector<Child>& children, int timeout_ms);
// Collects exited children; returns the index of the first that failed in this call, or -1.
int reap(std::vector<Child>& children);
bool any_running(const std::vector<Child>& children);
// SIGTERM now, SIGKILL after `grace`; output keeps flowing meanwhile.
void stop_all(std::vector<Child>& children, std::chrono::milliseconds grace);
// Relays what is left in the pipes of children that ended.
void drain(std::vector<Child>& children);

// Starts local rank `local_rank` of node `node_index` of `nodes` (launch()'s environment, and
// `extra` besides).
Child spawn_rank(const LaunchOptions& o, int node_index, int nodes, int local_rank, int port,
                 int attempt, const std::vector<std::string>& command, int stdin_fd,
                 const std::map<std::string, std::string>& extra);

// launch() with LaunchOptions::fault_tolerance (launch_replicas.cpp).
LaunchResult launch_replicas(const LaunchOptions& options, const std::vector<std::string>& command,
                             StopRequests& stop);

}  // namespace shardtrain::detail
