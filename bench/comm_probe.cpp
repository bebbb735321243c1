// `smp-bench allreduce-probe`: what a dp=2 gradient all-reduce costs on this
// machine through smp's own Communicator, two forked processes, side by side
// for both transports a same-host group can use:
//   * "gloo": c10d ProcessGroupGloo over loopback TCP (comm.shm_mb = 0),
//   * "shm":  smp's shared-memory all-reduce (core/src/comm/shm_collectives.h),
// each measured as:
//   * the all-reduce alone: wall time and the CPU time it burns (all threads),
//   * overlap: a 1-thread GEMM loop on the main thread while the all-reduce
//     runs, vs the GEMM loop alone (does the transfer hide behind compute when
//     every core computes?).
#include "comm_probe.h"

#include <smp/process_env.h>

#include "comm/communicator.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <boost/filesystem.hpp>

#include <chrono>
#include <fstream>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace bench {

namespace {

using Clock = std::chrono::steady_clock;

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

nlohmann::json measure(smp::Communicator& comm, int64_t bytes, int reps) {
  at::Tensor t = at::ones({bytes / 4});
  for (int i = 0; i < 2; ++i) comm.allreduce(t)->wait();  // warm-up (connections, segment)

  double best_wall = 1e9, cpu_at_best = 0;
  for (int r = 0; r < reps; ++r) {
    comm.barrier();
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    comm.allreduce(t)->wait();
    const double w = since(t0), c = cpu_seconds() - c0;
    if (w < best_wall) best_wall = w, cpu_at_best = c;
  }

  // A GEMM loop (~3x the all-reduce) alone, then with the all-reduce in flight.
  at::Tensor a = at::randn({512, 512}), b = at::randn({512, 512}), c = at::mm(a, b);
  auto t0 = Clock::now();
  at::mm_out(c, a, b);
  const double one_mm = since(t0);
  const int mms = std::max(4, static_cast<int>(3 * best_wall / std::max(one_mm, 1e-6)));
  double compute_alone = 1e9, overlapped = 1e9, compute_part = 1e9;
  for (int r = 0; r < reps; ++r) {
    comm.barrier();
    t0 = Clock::now();
    for (int i = 0; i < mms; ++i) at::mm_out(c, a, b);
    compute_alone = std::min(compute_alone, since(t0));
    comm.barrier();
    t0 = Clock::now();
    auto work = comm.allreduce(t);
    for (int i = 0; i < mms; ++i) at::mm_out(c, a, b);
    const double cp = since(t0);
    work->wait();
    const double total = since(t0);
    if (total < overlapped) overlapped = total, compute_part = cp;
  }
  return {{"transport", comm.transport("allreduce", at::kCPU)},
          {"allreduce_wall_s", best_wall},
          {"allreduce_cpu_s_all_threads", cpu_at_best},
          {"allreduce_effective_GBps", static_cast<double>(bytes) / best_wall / 1e9},
          {"gemm_loop_alone_s", compute_alone},
          {"gemm_loop_with_allreduce_in_flight_s", compute_part},
          {"gemm_loop_plus_wait_s", overlapped},
          {"hidden_fraction_of_allreduce", 1.0 - (overlapped - compute_alone) / best_wall}};
}

nlohmann::json one_rank(int rank, int port, int64_t bytes, int reps) {
  at::set_num_threads(1);
  auto rdv = smp::Rendezvous::connect("127.0.0.1", port, rank, 2, std::chrono::seconds(60));
  nlohmann::json out{{"rank", rank}, {"bytes", bytes}};
  smp::CommOptions opts;
  opts.timeout = std::chrono::seconds(60);
  opts.shm_slot_bytes = 0;
  out["gloo"] = measure(*rdv->new_communicator("dp", "probe.gloo", {0, 1}, opts), bytes, reps);
  opts.shm_slot_bytes = smp::CommOptions{}.shm_slot_bytes;
  out["shm"] = measure(*rdv->new_communicator("dp", "probe.shm", {0, 1}, opts), bytes, reps);
  rdv->shutdown(std::chrono::seconds(60));
  return out;
}

}  // namespace

nlohmann::json run_allreduce_probe(int64_t bytes, int reps) {
  namespace fs = boost::filesystem;
  const fs::path dir = fs::temp_directory_path() / fs::unique_path("smp-bench-ar-%%%%%%");
  fs::create_directories(dir);
  const std::string out1 = (dir / "rank1.json").string();
  const int port = smp::find_free_port();
  pid_t pid = fork();
  if (pid == 0) {
    int rc = 0;
    try {
      std::ofstream(out1) << one_rank(1, port, bytes, reps).dump();
    } catch (const std::exception& e) {
      std::ofstream(out1) << nlohmann::json{{"error", e.what()}}.dump();
      rc = 1;
    }
    _exit(rc);
  }
  nlohmann::json r0 = one_rank(0, port, bytes, reps);
  int status = 0;
  waitpid(pid, &status, 0);
  nlohmann::json r1;
  std::ifstream in(out1);
  if (in) r1 = nlohmann::json::parse(in, nullptr, false);
  boost::system::error_code ec;
  fs::remove_all(dir, ec);
  return {{"ranks", {r0, r1}},
          {"note", "smp Communicator all-reduce between 2 processes on one host, through Gloo (loopback TCP) "
                   "and through shared memory; 1 intra-op thread each; best of the reps"}};
}

}  // namespace bench
