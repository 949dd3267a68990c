// Rendezvous from the environment a launcher leaves: torchrun (and `shardtrain launch`),
// OpenMPI's mpirun, and Slurm's srun. Ranks meet over a TCP store hosted by rank 0.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "shardtrain/dist.h"

namespace shardtrain {

using Environment = std::map<std::string, std::string>;

// This process's environment variables.
Environment current_environment();

struct RendezvousInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Where the ranks came from: "torchrun", "openmpi", "slurm", or "single" (no launcher).
  std::string source = "single";
  // Which restart of the job this is: 0 on the first attempt, then the launcher's count
  // (TORCHELASTIC_RESTART_COUNT, which torchrun and `shardtrain launch` set).
  int restart_count = 0;
};

// Reads the rank layout from `env`. torchrun variables (RANK WORLD_SIZE LOCAL_RANK
// LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT) win; else OMPI_COMM_WORLD_*; else SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID. With none of them, a single process. MASTER_ADDR, MASTER_PORT and
// TORCHELASTIC_RESTART_COUNT are read under every launcher (Slurm falls back to the first host of
// SLURM_JOB_NODELIST). Throws std::invalid_argument naming the variable on inconsistent or
// malformed values.
RendezvousInfo rendezvous_info(const Environment& env);

// The address this rank's Gloo transport binds when no interface or hostname was given:
// loopback when the master is loopback; else the first address this host's name resolves to
// that is not loopback, or, when it resolves only to loopback (as in many containers and VMs),
// the local address of the route to the master.
// `reason` is empty, or says why the route's address was chosen.
struct TransportAddress {
  std::string hostname;
  std::string reason;
};
TransportAddress transport_address(const std::string& master_addr, int master_port);

// Reads the environment, connects the TCP store (rank 0 hosts it) and the world group.
// Every rank calls it; blocks until all joined or options.timeout_ passed (naming the missing
// ranks). A store that takes the connection but never answers (another service on
// MASTER_PORT) is given up on after options.timeout_ and 5 s, with a std::runtime_error naming
// the address. Gloo binds transport_address() (GLOO_SOCKET_IFNAME, when set, picks an
// interface instead).
std::shared_ptr<ProcessGroup> init_from_environment(ProcessGroupOptions options = {});
std::shared_ptr<ProcessGroup> init_from_environment(const RendezvousInfo& info,
                                                    ProcessGroupOptions options = {});

// Test and tooling harness: runs fn(group) on `world_size` ranks as threads of this process,
// connected over the real Gloo transport on loopback through an in-memory store. Returns when
// every rank finished; if any rank threw, rethrows the lowest rank's error prefixed with it.
void run_local_ranks(int world_size, const std::function<void(ProcessGroup&)>& fn,
                     ProcessGroupOptions options = {});

}  // namespace shardtrain
