// Weight gradients computed later than autograd would, in time a rank would
// otherwise spend waiting for an exchange (zero-bubble's B/W split, applied
// inside one backward pass; DeepSeek-V3's DualPipe overlaps MoE all-to-alls
// with weight gradients alike).
//
// Under expert parallelism a backward all-to-all waits for the slowest rank's
// input gradients; the experts' weight gradients are needed by nothing in the
// backward pass, only by the optimizer. A grouped GEMM may therefore leave
// its weight gradient as a task in this thread's pool; an exchange that
// would wait runs tasks while its event is not ready; the flush point (an
// identity on the first MoE layer's input, whose backward runs after every
// MoE layer's) runs what is left. A finished task hands its gradient to
// autograd (backward on the parameter itself), so AccumulateGrad, its hooks
// (data-parallel buckets, ZeRO) and .grad see exactly one gradient per
// parameter and microbatch, as without deferral.
#pragma once

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/graph_task.h>

#include <deque>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace smp_nn {

class DeferredWeightGrads {
 public:
  // One weight's gradient in steps: step() does a part and returns true once
  // the task is complete (its gradient handed to autograd).
  using Step = std::function<bool()>;

  // This thread's pool (the CPU autograd engine runs a backward pass on the
  // thread that started it).
  static DeferredWeightGrads& current() {
    static thread_local DeferredWeightGrads pool;
    return pool;
  }

  void add(Step s) { tasks_.push_back(std::move(s)); }
  bool empty() const { return tasks_.empty(); }
  size_t pending() const { return tasks_.size(); }

  // Runs one step of the oldest task; false when there is none.
  bool run_one() {
    if (tasks_.empty()) return false;
    Step step = std::move(tasks_.front());
    tasks_.pop_front();
    if (!step()) tasks_.push_front(std::move(step));
    return true;
  }
  // Runs steps while `waiting()` holds and tasks remain.
  template <class Pred>
  void run_while(Pred waiting) {
    while (waiting() && run_one()) {
    }
  }
  void flush() {
    while (run_one()) {
    }
  }
  // Forgets tasks that can no longer run (a backward pass that failed).
  void clear() { tasks_.clear(); }

  // Whether the MoE layers of the forward pass being built may defer: set by
  // the first layer of each chain (see FlushPoint), read by the ones after it.
  bool armed = false;

 private:
  std::deque<Step> tasks_;
};

namespace detail {
// Identity forward; its backward runs the pool's remaining tasks.
struct FlushPoint : torch::autograd::Function<FlushPoint> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) { return x.view_as(x); }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*, torch::autograd::variable_list g) {
    DeferredWeightGrads::current().flush();
    return g;
  }
};

// The parameter a deferred grouped GEMM's gradient goes to. Not a tensor
// argument of the autograd function (that would give it an edge to the
// parameter's AccumulateGrad, which would then run, hooks and all, with no
// gradient).
struct ParamRef {
  at::Tensor param;
};
}  // namespace detail

// Whether this thread is inside a backward pass (a recomputation under
// activation checkpointing builds its forward there).
inline bool in_backward_pass() { return torch::autograd::get_current_graph_task_exec_info() != nullptr; }

// A pass restricted to some inputs (autograd::grad, a zero-bubble input
// pass) must not accumulate into .grad, which a deferred task does; the
// layers do not defer under such schedules, so this is a fault, not a choice.
inline void check_unrestricted_backward() {
  const auto* exec = torch::autograd::get_current_graph_task_exec_info();
  if (exec && !exec->empty())
    throw std::logic_error("deferred expert weight gradient inside a backward pass restricted to some inputs");
}

// The first MoE layer of a forward chain: arms (or disarms) deferral for the
// layers after it and, when armed, returns x behind a flush point. Tasks
// pending at a chain start outside a backward pass mean a backward pass ended
// without reaching its flush point: their gradients never arrived, so stop
// loudly rather than train without them. Inside one (a recomputed chain) the
// outer pass' tasks stay; this chain's flush point runs them too.
inline at::Tensor start_deferral_chain(const at::Tensor& x, bool defer, const std::string& node) {
  DeferredWeightGrads& pool = DeferredWeightGrads::current();
  if (!pool.empty() && !in_backward_pass()) {
    const size_t n = pool.pending();
    pool.clear();
    throw std::logic_error("node '" + node + "': " + std::to_string(n) +
                           " deferred expert weight gradient(s) of the last backward pass were never computed");
  }
  pool.armed = defer;
  return defer ? detail::FlushPoint::apply(x) : x;
}

}  // namespace smp_nn
