// Where this process sits in the job, from the launcher's environment.
#pragma once

#include <string>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

// The most ranks a job may have (smp-launch's --nproc-per-node x --nnodes,
// smp-plan's --world) and one node may hold (--nproc-per-node, a cluster
// file's node.accelerators): far above any machine built, and small enough
// that a rank, a world size or a product of layout degrees stays in an int.
inline constexpr int kMaxWorldSize = 1 << 20;
inline constexpr int kMaxLocalWorldSize = 4096;

struct ProcessEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // "smp-launch" (RANK.. with SMP_LAUNCHED=1), "env" (RANK.. set by another
  // launcher, e.g. torchrun), "slurm", "mpi" (Open MPI) or "single".
  std::string source = "single";

  // In order: RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT;
  // SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID (MASTER_ADDR from the environment or
  // SLURM_LAUNCH_NODE_IPADDR, MASTER_PORT from the environment or derived from
  // SLURM_JOB_ID); OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK; else a single process
  // (rank 0 of 1 on 127.0.0.1 and a free port). Throws smp::Error naming the
  // variable when one is malformed or inconsistent.
  static ProcessEnv from_environment();
  // One source only (what smp-launch does when it runs under srun / mpirun).
  static ProcessEnv from_slurm();
  static ProcessEnv from_open_mpi();
};

// A TCP port that was free on `addr` a moment ago (bind to port 0, read it back).
int find_free_port(const std::string& addr = "127.0.0.1");

// Intra-op threads for this rank: `configured` when > 0 (run.threads), else
// OMP_NUM_THREADS (smp-launch sets 1 when ranks share a node), else 0 = LibTorch's default.
int threads_per_rank(int configured);

}  // namespace smp
#pragma GCC visibility pop
