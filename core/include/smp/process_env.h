// Where this process sits in the job, from the launcher's environment.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
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

// Notices to smp-launch through the pipe SMP_HEARTBEAT_FD names (the one
// place that reads the variable; trainer/heartbeat.cpp's beats go through
// notify_launcher too). Lines the workers send: "timeout <s>" (the rank's
// run.hang_timeout_s, first), "beat", "step <n>" (n steps done after a
// training step), "committed <n>" (rank 0: checkpoint step-<n> is committed
// and `latest` names it). smp-launch takes every line as a beat.
//
// Inline, header-only: core/src/checkpoint/checkpoint.cpp calls it, and the
// fuzz and tsan builds compile that file without process_env.cpp.

// The descriptor SMP_HEARTBEAT_FD names when it is open (made non-blocking
// and close-on-exec), else -1: no variable, not a number, or closed.
inline int launcher_notice_fd() {
  const char* v = std::getenv("SMP_HEARTBEAT_FD");
  if (!v || !*v) return -1;
  char* end = nullptr;
  const long fd = std::strtol(v, &end, 10);
  if (*end != '\0' || fd < 0 || fd > 1 << 30) return -1;
  const int d = static_cast<int>(fd);
  const int fl = ::fcntl(d, F_GETFL);
  if (fl < 0) return -1;
  // Never block training on a full pipe: a line that does not fit is dropped.
  if (!(fl & O_NONBLOCK)) ::fcntl(d, F_SETFL, fl | O_NONBLOCK);
  const int fdfl = ::fcntl(d, F_GETFD);
  if (fdfl >= 0 && !(fdfl & FD_CLOEXEC)) ::fcntl(d, F_SETFD, fdfl | FD_CLOEXEC);
  return d;
}

// Writes line + "\n" to smp-launch in one write() (a longer line is cut to
// its first 256 bytes: far below PIPE_BUF, so the pipe takes each line whole,
// never interleaved with another thread's); nothing without SMP_HEARTBEAT_FD,
// never blocks, never throws.
inline void notify_launcher(const std::string& line) {
  const int fd = launcher_notice_fd();
  if (fd < 0) return;
  char buf[257];
  const size_t len = line.copy(buf, 256);
  buf[len] = '\n';
  const ssize_t n = ::write(fd, buf, len + 1);
  (void)n;
}

}  // namespace smp
#pragma GCC visibility pop
