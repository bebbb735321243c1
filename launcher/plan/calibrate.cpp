#include "plan/calibrate.h"

#include <smp/error.h>
#include <smp/process_env.h>

#include "comm/communicator.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

namespace smp::plan {

namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double best_of(int n, F f) {
  double best = 1e30;
  for (int i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

double gemm_rate(int64_t n, at::ScalarType dtype) {
  const at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  at::Tensor c = at::mm(a, b);
  const int inner = std::max<int64_t>(1, (int64_t{256} * 256 * 256) / (n * n * n));  // at least ~33 MFLOP a try
  const double t = best_of(5, [&] {
    for (int i = 0; i < inner; ++i) at::mm_out(c, a, b);
  });
  return 2.0 * n * n * n * inner / t;
}

// {latency s, bandwidth bytes/s} of an all-reduce between two forked processes.
struct LinkFigures {
  double latency = 0, bandwidth = 0;
};
LinkFigures probe(Communicator& comm) {
  at::Tensor small = at::ones({1}), big = at::ones({int64_t{64} << 18});  // 4 bytes, 64 MB
  for (int i = 0; i < 3; ++i) comm.allreduce(small)->wait(), comm.allreduce(big)->wait();
  const auto timed = [&](at::Tensor& t, int reps) {  // best of `reps`, each after a barrier
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
      comm.barrier();
      const auto t0 = Clock::now();
      comm.allreduce(t)->wait();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best;
  };
  const double tiny = timed(small, 50), large = timed(big, 5);
  LinkFigures f;
  f.latency = tiny / 2;  // a 2-rank ring: two steps
  f.bandwidth = static_cast<double>(big.numel() * 4) / std::max(large - tiny, 1e-9);
  return f;
}

// Rank `rank` of the two: {shm, gloo} figures.
std::pair<LinkFigures, LinkFigures> link_rank(int rank, int port) {
  at::set_num_threads(1);
  auto rdv = Rendezvous::connect("127.0.0.1", port, rank, 2, std::chrono::seconds(60));
  CommOptions opts;
  opts.timeout = std::chrono::seconds(60);
  const LinkFigures shm = probe(*rdv->new_communicator("dp", "calibrate.shm", {0, 1}, opts));
  opts.shm_slot_bytes = 0;  // Gloo
  const LinkFigures gloo = probe(*rdv->new_communicator("dp", "calibrate.gloo", {0, 1}, opts));
  rdv->shutdown(std::chrono::seconds(60));
  return {shm, gloo};
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "this machine's CPU";
}

double mem_total_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (in >> key >> kb)
    if (key == "MemTotal:") return kb * 1024;
  return 0;
}

std::string number(double v) {
  std::ostringstream s;
  s.precision(4);
  s << v;
  std::string out = s.str();
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return out;
}

}  // namespace

std::string calibrate(const std::string& path, int threads) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int ranks = std::max(1, cores / std::max(1, threads));
  // The links first, while this process has no intra-op pool to fork with.
  const int port = find_free_port();
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 0;
    try {
      link_rank(1, port);
    } catch (...) {
      rc = 1;
    }
    ::_exit(rc);
  }
  const auto [shm, gloo] = link_rank(0, port);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw Error("calibrate: the link probe's second process failed");
  at::set_num_threads(threads);
  std::vector<std::pair<int64_t, double>> rates;
  for (int64_t n : {32, 64, 128, 256, 512, 1024, 2048}) rates.emplace_back(n, gemm_rate(n, at::kFloat));
  double peak = 0;
  for (const auto& [n, r] : rates) peak = std::max(peak, r);
  double eff_1024 = 1;
  for (const auto& [n, r] : rates)
    if (n == 1024) eff_1024 = r / peak;
  const double bf16_peak = gemm_rate(1024, at::kBFloat16) / eff_1024;
  const at::Tensor src = at::ones({int64_t{64} << 20});  // 256 MB
  at::Tensor dst = at::empty_like(src);
  const double copy = best_of(5, [&] { dst.copy_(src); });
  const double memory_bandwidth = 2.0 * src.numel() * 4 / copy;
  std::ostringstream t;
  t << "# This machine, measured by smp-plan --calibrate (launcher/plan/calibrate.h): " << ranks << " ranks of "
    << threads << " thread(s) on " << cores << " cores.\n"
    << "# Inside the node the ranks talk through shared memory; between nodes through Gloo\n"
    << "# (loopback TCP here, a stand-in for a real network).\n"
    << "name = \"this-machine\"\n\n[accelerator]\nname = \"" << cpu_name() << " (" << threads << " thread(s) a rank)\"\n"
    << "memory_gb = " << number(mem_total_bytes() / ranks / 1e9) << "\n"
    << "memory_bandwidth_gbs = " << number(memory_bandwidth / 1e9) << "\n"
    << "peak_tflops = { fp32 = " << number(peak / 1e12) << ", bf16 = " << number(bf16_peak / 1e12) << " }\n"
    << "gemm_efficiency = [";
  for (size_t i = 0; i < rates.size(); ++i)
    t << (i ? ", " : "") << "[" << rates[i].first << ", " << number(std::min(1.0, rates[i].second / peak)) << "]";
  t << "]\n\n[node]\naccelerators = " << ranks << "\n\n[links.intra]\nbandwidth_gbs = " << number(shm.bandwidth / 1e9)
    << "\nlatency_us = " << number(shm.latency * 1e6) << "\n\n[links.inter]\nbandwidth_gbs = "
    << number(std::min(gloo.bandwidth, shm.bandwidth) / 1e9) << "\nlatency_us = " << number(gloo.latency * 1e6)
    << "\n\n[topology]\ninside_node = [\"tp\", \"pp\", \"dp\"]\n";
  std::ofstream(path) << t.str();
  if (!std::ifstream(path)) throw Error(path + ": cannot write");
  return t.str();
}

}  // namespace smp::plan
