// Check 3 of tsan_races (races.cpp): the deferred expert weight-gradient pool
// (plugins/nn/include/smp_nn/deferred_grads.hpp) with the threads that meet
// it in a real backward pass.
//
// The pool is thread_local: the autograd thread that runs a backward pass
// fills it (DeferredGroupedMm), runs it while an exchange is in flight
// (wait_filling, polling an event a communicator thread completes) and at the
// flush point; a finished task hands its gradient to autograd, whose
// AccumulateGrad hook (GradientSync's dp buckets, core/src/memory) launches an
// all-reduce on a communicator thread; the training thread builds the forward
// pass (start_deferral_chain: the pool's `armed` and leftovers) and waits for
// the buckets (finish_step). On the CPU the engine runs backward on the thread
// that calls it; on a GPU on the device's worker thread while the training
// thread waits: the steps here alternate between the two. Two ranks run as two
// threads of this process (as tests/train/gradient_sync_test.cpp does), each
// with its own training and worker thread, over real core communicators (the
// exchanges: all-to-alls on "ep"; the buckets: all-reduces on "dp").
//
// Each rank's first step runs without deferral (GroupedMm) and gives the
// reference gradients; every deferred step must reproduce them exactly once
// per parameter (a task run twice or never would change the sum).
#include "comm/communicator.h"
#include "memory/gradient_sync.h"

#include <smp_nn/moe.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/autograd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

// The host's event as core/src/plugin/host_api.cpp keeps it: a Work and
// whether it was waited for (this program links no plugin host).
struct smp_event {
  std::shared_ptr<smp::Work> work;
  std::mutex mu;
  bool waited = false;
};

namespace tsan_races {

int free_port();

namespace {

int32_t event_ready(smp_event* e) {
  std::lock_guard<std::mutex> lock(e->mu);
  return e->waited || e->work->ready() ? 1 : 0;
}
smp_error* event_wait(smp_event* e) {
  std::lock_guard<std::mutex> lock(e->mu);
  if (!e->waited) {
    e->waited = true;
    e->work->wait();  // a failure ends the program: no error table here
  }
  return nullptr;
}
void event_destroy(smp_event* e) {
  event_wait(e);
  delete e;
}

// Deferred steps run inside exchanges (while one was in flight), all ranks.
std::atomic<int> steps_while_waiting{0};

// An exchange whose backward is the experts' combine: an all-to-all of the
// gradient, with deferred weight gradients run while it is in flight
// (smp_nn::detail::wait_filling, as CombineAllToAll does).
struct Exchange : torch::autograd::Function<Exchange> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    auto* comm = reinterpret_cast<smp::Communicator*>(ctx->saved_data["comm"].toInt());
    const at::Tensor in = g[0].contiguous();
    at::Tensor out = at::empty_like(in);
    auto* e = new smp_event;
    e->work = comm->alltoall(in, out, {}, {});
    smp::sdk::Event event(e);
    smp_nn::DeferredWeightGrads& pool = smp_nn::DeferredWeightGrads::current();
    const size_t before = pool.pending();
    smp_nn::detail::wait_filling(event);
    if (pool.pending() < before) steps_while_waiting += static_cast<int>(before - pool.pending());
    return {out, at::Tensor()};
  }
};

// The thread that runs a GPU's backward passes (the autograd engine's device
// worker): the training thread hands it a pass and waits.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(std::function<void()> f) {
    std::unique_lock<std::mutex> lock(mu_);
    job_ = std::move(f);
    cv_.notify_all();
    cv_.wait(lock, [this] { return !job_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [this] { return stop_ || job_; });
      if (stop_) return;
      try {
        job_();
      } catch (...) {
        error_ = std::current_exception();
      }
      job_ = nullptr;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

constexpr int64_t kRows = 64, kHidden = 32, kExperts = 2;

// One rank: `steps` steps, the first without deferral.
void rank_main(int rank, int port, int steps) {
  auto rdzv = smp::Rendezvous::connect("127.0.0.1", port, rank, 2, std::chrono::seconds(60));
  smp::CommOptions opts;
  opts.timeout = std::chrono::seconds(60);
  std::unique_ptr<smp::Communicator> ep = rdzv->new_communicator("ep", "ep", {0, 1}, opts);
  std::unique_ptr<smp::Communicator> dp = rdzv->new_communicator("dp", "dp", {0, 1}, opts);
  // Each rank its own generator: the same weights on both, as data parallelism has them.
  at::Generator gen = at::detail::createCPUGenerator(7);
  std::vector<at::Tensor> w;
  for (int k = 0; k < 3; ++k)
    w.push_back(at::randn({kExperts, kHidden, kHidden}, gen).div_(8).requires_grad_(true));
  std::vector<smp::SyncedParameter> synced;
  for (const auto& t : w) {
    smp::SyncedParameter s;
    s.tensor = t;
    s.data_parallel = dp.get();
    synced.push_back(s);
  }
  // One bucket per parameter, launched from the hook of its AccumulateGrad:
  // from inside a deferred task, on the autograd thread.
  smp::GradientSync sync(synced, smp::GradientSyncOptions{1, 0});
  const at::Tensor input = at::randn({kRows, kHidden}, gen).add_(rank);
  const std::vector<int64_t> counts = {16, 16, 16, 16};  // two rounds over the two experts
  Worker device;
  std::vector<at::Tensor> reference;
  for (int step = 0; step < steps; ++step) {
    const bool defer = step > 0;
    // The training thread: the forward pass.
    at::Tensor x = input.clone().requires_grad_(true);
    at::Tensor h = smp_nn::start_deferral_chain(x, defer, "tsan");
    if (smp_nn::DeferredWeightGrads::current().armed != defer) throw std::logic_error("pool not armed as asked");
    for (const auto& p : w) {
      h = defer ? smp_nn::detail::DeferredGroupedMm::apply(h.contiguous(), p.detach(), counts,
                                                          smp_nn::detail::ParamRef{p})
                : smp_nn::grouped_mm(h, p, counts);
      h = at::tanh(Exchange::apply(h, reinterpret_cast<int64_t>(ep.get())));
    }
    const at::Tensor loss = (h * h).sum();
    sync.begin_step();
    if (step % 2 == 1)
      device.run([&] { loss.backward(); });  // a GPU's way: the device's autograd thread
    else
      loss.backward();  // the CPU's: this thread
    sync.finish_step();
    if (!smp_nn::DeferredWeightGrads::current().empty()) throw std::logic_error("tasks left in the training thread's pool");
    for (size_t k = 0; k < w.size(); ++k) {
      const at::Tensor g = sync.gradient(k).clone();
      if (step == 0)
        reference.push_back(g);
      else if (!at::allclose(g, reference[k], 1e-5, 1e-6))
        throw std::logic_error("step " + std::to_string(step) + ": parameter " + std::to_string(k) +
                               "'s deferred gradient differs from the reference by " +
                               std::to_string((g - reference[k]).abs().max().item<double>()));
    }
  }
  rdzv->shutdown(std::chrono::seconds(30));
}

}  // namespace

void deferred_weight_grads() {
  static smp_host_api host{};
  host.event_ready = &event_ready;
  host.event_wait = &event_wait;
  host.event_destroy = &event_destroy;
  smp::sdk::host_slot() = &host;
  const int port = free_port();
  const int steps = 7;
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      try {
        rank_main(r, port, steps);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) std::fprintf(stderr, "tsan_races: deferred weight gradients: %s\n", e.c_str());
  if (!errors.empty()) std::exit(3);
  std::printf("tsan_races: deferred weight gradients done: 2 ranks x %d steps, gradients as without deferral "
              "(%d tasks finished inside an exchange's wait)\n",
              steps, steps_while_waiting.load());
}

}  // namespace tsan_races
