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

// The three GEMMs a linear layer's step does with `n` its smallest dimension
// (rows 4n: forward X W, input gradient dY W^T, weight gradient X^T dY),
// with their operands out of cache as a step finds them: a try walks through
// copies of at least 64 MB in all.
class GemmProbe {
 public:
  GemmProbe(int64_t n, at::ScalarType dtype) : n_(n), rows_(4 * n) {
    copies_ = std::max<int64_t>(1, (int64_t{64} << 20) / ((2 * rows_ * n + n * n) * 4));
    for (int64_t i = 0; i < copies_; ++i)
      x_.push_back(at::randn({rows_, n}).to(dtype)), w_.push_back(at::randn({n, n}).to(dtype)),
          dy_.push_back(at::randn({rows_, n}).to(dtype));
    y_ = at::mm(x_[0], w_[0]), dx_ = at::mm(dy_[0], w_[0].t()), dw_ = at::mm(x_[0].t(), dy_[0]);
    inner_ = std::max<int64_t>(copies_, (int64_t{64} * 256 * 256 * 256) / (rows_ * n * n));
  }
  int64_t size() const { return n_; }
  double flops_per_second() {  // one try
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < inner_; ++i) {
      const int64_t c = i % copies_;
      at::mm_out(y_, x_[c], w_[c]), at::mm_out(dx_, dy_[c], w_[c].t()), at::mm_out(dw_, x_[c].t(), dy_[c]);
    }
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    return 3 * 2.0 * static_cast<double>(rows_ * n_ * n_ * inner_) / t;
  }

 private:
  int64_t n_, rows_, copies_ = 1, inner_ = 1;
  std::vector<at::Tensor> x_, w_, dy_;
  at::Tensor y_, dx_, dw_;
};

// Bytes/s of the elementwise work of a transformer layer, counted as the
// step model counts it (plan/step_model.cpp: passes over [T, h],
// over q, k, v, over the MLP's [T, f] and over the attention probabilities),
// timed as a layer does it forward and backward: two layer norms and two
// residual adds over [T, h], q, k and v made contiguous and their gradients
// concatenated, GELU (tanh) over [T, f], softmax over [b heads, s, s]; a layer of
// hidden 512, ffn 2048, 8 heads, sequence 256, 2 samples (T = 512 tokens).
double elementwise_rate() {
  const int64_t b = 2, s = 256, h = 512, f = 2048, heads = 8, T = b * s;
  const at::Tensor x = at::randn({T, h}), gx = at::randn({T, h}), w = at::ones({h}), bias = at::zeros({h});
  const at::Tensor u = at::randn({T, f}), gu = at::randn({T, f});
  const at::Tensor qkv = at::randn({b, s, 3, heads, h / heads}), gq = at::randn({b, heads, s, h / heads});
  const at::Tensor p = at::randn({b * heads, s, s}), gp = at::randn({b * heads, s, s});
  const double t = best_of(5, [&] {
    for (int norm = 0; norm < 2; ++norm) {
      const auto [ln, mean, rstd] = at::native_layer_norm(x, {h}, w, bias, 1e-5);
      const auto dln = at::native_layer_norm_backward(gx, x, {h}, mean, rstd, w, bias, {true, true, true});
      const at::Tensor sum = at::add(x, gx);
    }
    std::vector<at::Tensor> parts;
    for (int64_t i = 0; i < 3; ++i) parts.push_back(qkv.select(2, i).transpose(1, 2).contiguous());
    const at::Tensor dqkv = at::cat({gq, gq, gq}, 3);
    const at::Tensor y = at::gelu(u, "tanh");  // GPT-2's, as smp's MLP computes it
    const at::Tensor du = at::gelu_backward(gu, u, "tanh");
    const at::Tensor sm = at::_softmax(p, 2, false);
    const at::Tensor dsm = at::_softmax_backward_data(gp, sm, 2, at::kFloat);
  });
  // The step model's passes (forward; a backward makes twice as many).
  const double passes = 16.0 * T * h + 4.0 * T * 3 * h + 2.0 * T * f + 5.0 * b * heads * s * s;
  return 3 * passes * 4 / t;
}

// Seconds of host time per operator an autograd step pays: a small add and
// mul recorded for backward and run back, over the operators that makes
// (forward 2, backward 2 plus the gradients' accumulation).
double op_overhead() {
  const at::Tensor a = at::ones({8}).requires_grad_(true), b = at::ones({8}).requires_grad_(true);
  const int reps = 2000;
  const double t = best_of(5, [&] {
    for (int i = 0; i < reps; ++i) {
      at::Tensor y = at::mul(at::add(a, b), b).sum();
      y.backward();
    }
  });
  return t / reps / 8;
}

struct ComputeFigures {
  std::vector<std::pair<int64_t, double>> fp32_rates;
  double bf16_rate_1024 = 0, elementwise = 0, op = 0, memory_bandwidth = 0;
};

// Every rank of the node measures at once: a rank's share of the cores, the
// memory and the caches is what it gets while training.
ComputeFigures compute_figures() {
  ComputeFigures f;
  // Every size once per round, five rounds, the best of each: a passing
  // disturbance costs one round of every size, not every try of one.
  std::vector<GemmProbe> probes;
  for (int64_t n : {32, 64, 128, 256, 512, 1024, 2048}) probes.emplace_back(n, at::kFloat);
  probes.emplace_back(1024, at::kBFloat16);
  std::vector<double> best(probes.size(), 0);
  for (int round = 0; round < 5; ++round)
    for (size_t i = 0; i < probes.size(); ++i) best[i] = std::max(best[i], probes[i].flops_per_second());
  for (size_t i = 0; i + 1 < probes.size(); ++i) f.fp32_rates.emplace_back(probes[i].size(), best[i]);
  f.bf16_rate_1024 = best.back();
  f.elementwise = elementwise_rate();
  f.op = op_overhead();
  const at::Tensor src = at::ones({int64_t{64} << 20});  // 256 MB
  at::Tensor dst = at::empty_like(src);
  const double copy = best_of(5, [&] { dst.copy_(src); });
  f.memory_bandwidth = 2.0 * src.numel() * 4 / copy;
  return f;
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

// The all-to-all as a training step pays it: between computations (a GEMM of
// about a millisecond on every rank), not after a barrier, so that what the
// ranks' drift and the transport's threads cost is in it. {latency, bandwidth}
// from 8 bytes and 4 MB exchanged after each computation, 20 times, best of 5,
// less the computations alone.
std::pair<double, double> alltoall_between_computations(Communicator& comm) {
  const at::Tensor a = at::randn({256, 256}), b = at::randn({256, 256});
  at::Tensor c = at::mm(a, b);
  at::Tensor small_in = at::ones({2}), small_out = at::empty({2}), big_in = at::ones({int64_t{1} << 20}),
             big_out = at::empty_like(big_in);
  const int rounds = 20;
  const auto loop = [&](at::Tensor* in, at::Tensor* out) {
    double best = 1e30;
    for (int trial = 0; trial < 5; ++trial) {
      comm.barrier();
      const auto t0 = Clock::now();
      for (int r = 0; r < rounds; ++r) {
        for (int i = 0; i < 16; ++i) at::mm_out(c, a, b);
        if (in) comm.alltoall(*in, *out, {}, {})->wait();
      }
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return best / rounds;
  };
  const double alone = loop(nullptr, nullptr), small = loop(&small_in, &small_out), big = loop(&big_in, &big_out);
  const double latency = std::max(small - alone, 1e-7);
  return {latency, static_cast<double>(big_in.numel() * 4) / 2 / std::max(big - small, 1e-9)};
}

struct Measured {
  LinkFigures shm, gloo;
  double alltoall_latency = 0, alltoall_bandwidth = 0;
  ComputeFigures compute;
};

// Rank `rank` of the two: the links, then the compute figures with both
// ranks measuring at once.
Measured measure_rank(int rank, int port, int threads) {
  at::set_num_threads(threads);
  auto rdv = Rendezvous::connect("127.0.0.1", port, rank, 2, std::chrono::seconds(60));
  CommOptions opts;
  opts.timeout = std::chrono::seconds(60);
  auto shm_comm = rdv->new_communicator("dp", "calibrate.shm", {0, 1}, opts);
  const LinkFigures shm = probe(*shm_comm);
  const auto [a2a_latency, a2a_bandwidth] = alltoall_between_computations(*shm_comm);
  opts.shm_slot_bytes = 0;  // Gloo
  auto gloo_comm = rdv->new_communicator("dp", "calibrate.gloo", {0, 1}, opts);
  const LinkFigures gloo = probe(*gloo_comm);
  gloo_comm->barrier();
  const ComputeFigures compute = compute_figures();
  gloo_comm->barrier();
  rdv->shutdown(std::chrono::seconds(60));
  return {shm, gloo, a2a_latency, a2a_bandwidth, compute};
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
  // Two processes, forked while this one has no intra-op pool yet.
  const int port = find_free_port();
  const pid_t pid = ::fork();
  if (pid == 0) {
    int rc = 0;
    try {
      measure_rank(1, port, threads);
    } catch (...) {
      rc = 1;
    }
    ::_exit(rc);
  }
  const Measured m = measure_rank(0, port, threads);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw Error("calibrate: the second measuring process failed");
  const LinkFigures &shm = m.shm, &gloo = m.gloo;
  const auto& rates = m.compute.fp32_rates;
  double peak = 0;
  for (const auto& [n, r] : rates) peak = std::max(peak, r);
  double eff_1024 = 1;
  for (const auto& [n, r] : rates)
    if (n == 1024) eff_1024 = r / peak;
  const double bf16_peak = m.compute.bf16_rate_1024 / eff_1024;
  const double memory_bandwidth = m.compute.memory_bandwidth;
  std::ostringstream t;
  t << "# This machine, measured by smp-plan --calibrate (plan/calibrate.h): " << ranks << " ranks of "
    << threads << " thread(s) on " << cores << " cores;\n# two of them measured the compute figures at once.\n"
    << "# Inside the node the ranks talk through shared memory; between nodes through Gloo\n"
    << "# (loopback TCP here, a stand-in for a real network).\n"
    << "name = \"this-machine\"\n\n[accelerator]\nname = \"" << cpu_name() << " (" << threads << " thread(s) a rank)\"\n"
    << "memory_gb = " << number(mem_total_bytes() / ranks / 1e9) << "\n"
    << "memory_bandwidth_gbs = " << number(memory_bandwidth / 1e9) << "\n"
    << "elementwise_gbs = " << number(std::min(m.compute.elementwise, memory_bandwidth) / 1e9) << "\n"
    << "op_overhead_us = " << number(m.compute.op * 1e6) << "\n"
    << "peak_tflops = { fp32 = " << number(peak / 1e12) << ", bf16 = " << number(bf16_peak / 1e12) << " }\n"
    << "gemm_efficiency = [";
  for (size_t i = 0; i < rates.size(); ++i)
    t << (i ? ", " : "") << "[" << rates[i].first << ", " << number(std::min(1.0, rates[i].second / peak)) << "]";
  t << "]\n\n[node]\naccelerators = " << ranks << "\n\n[links.intra]\nbandwidth_gbs = " << number(shm.bandwidth / 1e9)
    << "\nlatency_us = " << number(shm.latency * 1e6) << "\n\n[links.inter]\nbandwidth_gbs = "
    << number(std::min(gloo.bandwidth, shm.bandwidth) / 1e9) << "\nlatency_us = " << number(gloo.latency * 1e6)
    << "\n\n# The all-to-all as expert parallelism calls it through the shared-memory group.\n[links.alltoall]\n"
    << "bandwidth_gbs = " << number(m.alltoall_bandwidth / 1e9) << "\nlatency_us = "
    << number(m.alltoall_latency * 1e6) << "\n\n[topology]\ninside_node = [\"tp\", \"pp\", \"dp\"]\n";
  std::ofstream(path) << t.str();
  if (!std::ifstream(path)) throw Error(path + ": cannot write");
  return t.str();
}

}  // namespace smp::plan
