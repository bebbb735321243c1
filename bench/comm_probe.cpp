// `smp-bench allreduce-probe`: what a dp=2 gradient all-reduce costs on this machine,
// measured with c10d's ProcessGroupGloo directly (the backend smp's Communicator uses),
// two forked processes on 127.0.0.1:
//   * allreduce alone: wall time and the CPU time it burns (all threads of the process),
//   * smp's bucket copies (at::cat of the gradients, copy back, scale),
//   * overlap: a 1-thread GEMM loop on the main thread while the all-reduce runs, vs
//     the GEMM loop alone (can the transfer hide behind compute when every core computes?).
#include "comm_probe.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

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

nlohmann::json one_rank(int rank, const std::string& store_path, int64_t bytes, int reps) {
  at::set_num_threads(1);
  auto store = c10::make_intrusive<c10d::FileStore>(store_path, 2);
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(60));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  opts->threads = 2;
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, 2, opts);

  const int64_t n = bytes / 4;
  std::vector<at::Tensor> t{at::ones({n})};
  for (int i = 0; i < 2; ++i) pg->allreduce(t)->wait();  // warm-up (connections)

  double best_wall = 1e9, cpu_at_best = 0;
  for (int r = 0; r < reps; ++r) {
    pg->barrier()->wait();
    const double c0 = cpu_seconds();
    const auto t0 = Clock::now();
    pg->allreduce(t)->wait();
    const double w = since(t0), c = cpu_seconds() - c0;
    if (w < best_wall) best_wall = w, cpu_at_best = c;
  }

  // The gradient-sync copies of core/src/gradient_sync.cpp for one flat bucket: cat, copy back, scale.
  std::vector<at::Tensor> grads;
  for (int64_t left = n; left > 0;) {
    int64_t k = std::min<int64_t>(left, 262144);  // up to 1 MiB pieces, like the GPT weights
    grads.push_back(at::ones({k}));
    left -= k;
  }
  double best_copy = 1e9;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    at::Tensor flat = at::cat(grads);
    int64_t off = 0;
    for (auto& g : grads) {
      g.copy_(flat.narrow(0, off, g.numel())).mul_(0.5);
      off += g.numel();
    }
    best_copy = std::min(best_copy, since(t0));
  }

  // Overlap: a GEMM loop (~3x the all-reduce time) alone, then with the all-reduce in flight.
  at::Tensor a = at::randn({512, 512}), b = at::randn({512, 512}), c = at::mm(a, b);
  auto t0 = Clock::now();
  at::mm_out(c, a, b);
  const double one_mm = since(t0);
  const int mms = std::max(4, static_cast<int>(3 * best_wall / std::max(one_mm, 1e-6)));
  double compute_alone = 1e9, overlapped = 1e9, compute_part = 1e9;
  for (int r = 0; r < reps; ++r) {
    pg->barrier()->wait();
    t0 = Clock::now();
    for (int i = 0; i < mms; ++i) at::mm_out(c, a, b);
    compute_alone = std::min(compute_alone, since(t0));
    pg->barrier()->wait();
    t0 = Clock::now();
    auto work = pg->allreduce(t);
    for (int i = 0; i < mms; ++i) at::mm_out(c, a, b);
    const double cp = since(t0);
    work->wait();
    const double total = since(t0);
    if (total < overlapped) overlapped = total, compute_part = cp;
  }
  return {{"rank", rank},
          {"bytes", bytes},
          {"allreduce_wall_s", best_wall},
          {"allreduce_cpu_s_all_threads", cpu_at_best},
          {"allreduce_effective_GBps", static_cast<double>(bytes) / best_wall / 1e9},
          {"bucket_copies_s", best_copy},
          {"gemm_loop_alone_s", compute_alone},
          {"gemm_loop_with_allreduce_in_flight_s", compute_part},
          {"gemm_loop_plus_wait_s", overlapped},
          {"hidden_fraction_of_allreduce", 1.0 - (overlapped - compute_alone) / best_wall}};
}

}  // namespace

nlohmann::json run_allreduce_probe(int64_t bytes, int reps) {
  namespace fs = boost::filesystem;
  const fs::path dir = fs::temp_directory_path() / fs::unique_path("smp-bench-ar-%%%%%%");
  fs::create_directories(dir);
  const std::string store = (dir / "store").string(), out1 = (dir / "rank1.json").string();
  pid_t pid = fork();
  if (pid == 0) {
    int rc = 0;
    try {
      std::ofstream(out1) << one_rank(1, store, bytes, reps).dump();
    } catch (const std::exception& e) {
      std::ofstream(out1) << nlohmann::json{{"error", e.what()}}.dump();
      rc = 1;
    }
    _exit(rc);
  }
  nlohmann::json r0 = one_rank(0, store, bytes, reps);
  int status = 0;
  waitpid(pid, &status, 0);
  nlohmann::json r1;
  std::ifstream in(out1);
  if (in) r1 = nlohmann::json::parse(in, nullptr, false);
  boost::system::error_code ec;
  fs::remove_all(dir, ec);
  return {{"ranks", {r0, r1}},
          {"note", "c10d ProcessGroupGloo, 2 processes on 127.0.0.1, 1 intra-op thread each; best of the reps"}};
}

}  // namespace bench
