// smp-launch's process supervisor: spawns the local ranks, watches them, tears
// the group down when one fails. Plain POSIX; no LibTorch.
#pragma once

#include <string>
#include <vector>

namespace smp::launch {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;        // 0: pick a free one (single node only)
  bool master_addr_given = false; // given on the command line (beats the environment)
  bool master_port_given = false;
  int max_restarts = 0;
  int threads_per_rank = 0;       // 0: OMP_NUM_THREADS from the environment, else 1 when nproc > 1
  // Pin local rank i to its own block of the cores this launcher may use
  // (threads_per_rank cores each, default all of them split evenly), like
  // DeepSpeed's --bind_cores_to_rank: no migrations, no two ranks on one core.
  bool bind_cores = false;
  double kill_timeout_s = 30;     // SIGTERM -> SIGKILL grace
  std::string log_dir;            // "" = no per-rank files
  bool tee = false;               // echo other ranks' lines as "[rank R] ..."
  std::string worker;             // executable (a name without '/' is looked up in PATH)
  std::vector<std::string> worker_args;

  // Elastic runs (--nnodes MIN:MAX): the nodes meet at a rendezvous
  // (rendezvous/server.h), which forms each round's world from the nodes
  // present; the workers restart on every change, on the layout chosen for
  // the new world (planned_layout.h), from the last committed checkpoint.
  bool elastic = false;
  int min_nodes = 1, max_nodes = 1;
  std::string rdzv_endpoint;      // HOST:PORT; the launcher that can bind it serves it
  double rdzv_timeout_s = 600;    // to reach the rendezvous, and for MIN nodes to be there
  double rdzv_settle_s = 5;       // the first round waits this long for more than MIN
  double rdzv_keepalive_s = 15;   // a node (or the rendezvous) silent this long is lost
  bool grow_now = false;          // --elastic-grow now: admit a node at once, not at the next checkpoint
  std::string node_name;          // in messages; default the host name
};

// Runs the elastic rendezvous alone on options.rdzv_endpoint (smp-launch
// --rdzv-server): until the job ends; 0 when it finished.
int serve_rendezvous(const LaunchOptions& options);

// Spawns and supervises nproc_per_node workers (restarting up to max_restarts
// times). Returns the launcher's exit code: 0 when every rank exited 0.
int supervise(const LaunchOptions& options);

// When this process runs under another launcher (srun: SLURM_PROCID and
// SLURM_NTASKS; mpirun: OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE) and not
// under smp-launch itself (SMP_LAUNCHED unset), returns its name ("slurm" or
// "mpi"); else "".
std::string external_launcher();

// Replaces this process with the worker, RANK etc. taken from the external
// launcher's variables. Returns only on failure (with the exit code to use).
int exec_under_external(const LaunchOptions& options, const std::string& which);

// The default worker: smp-worker next to this executable.
std::string default_worker_path();

}  // namespace smp::launch
