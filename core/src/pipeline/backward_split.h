// The zero-bubble split of one stage's backward (Qi et al. 2024, "Zero Bubble
// Pipeline Parallelism"): an input-gradient pass (B) that computes only the
// gradients the previous stage waits for, and a weight-gradient pass (W), run
// later, that computes the parameters' gradients from what B left behind
// without repeating any of B's work.
//
// How, over LibTorch's autograd graph (any module's, the plugins' too):
//   * X nodes: the graph nodes from which a stage input (a received
//     activation) is reachable. B runs exactly these (autograd::grad with the
//     inputs as targets), each computing only its outputs toward X.
//   * Frontier: X nodes with an edge into a node that reaches a parameter but
//     no stage input (e.g. a matmul's backward, whose weight side was skipped
//     in B). A hook captures the gradient each frontier node receives in B.
//   * After B the frontier's edges into X are cut and the saved tensors of the
//     other X nodes are freed (nothing later reads them). W starts at the
//     frontier nodes with their captured gradients (plus any root that reaches
//     no stage input, with its own gradient) and runs only the weight sides.
//   * A stage whose roots reach no received activation (the first) has no
//     input gradient to compute: B does nothing, W runs its whole backward
//     (the ZB-H1 plan knows, see schedule.h: zb_default_costs).
// The work done is one ordinary backward's, split in two; what stays alive
// between them is what the weight gradients read (their saved inputs).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace smp {

class BackwardSplit {
 public:
  BackwardSplit();
  ~BackwardSplit();
  BackwardSplit(const BackwardSplit&) = delete;
  BackwardSplit& operator=(const BackwardSplit&) = delete;

  // B: the gradients of `inputs` (autograd leaves; undefined where no
  // gradient reaches one) for `roots` seeded with `grads`. Parameters' .grad
  // is untouched. Call once.
  std::vector<at::Tensor> input_pass(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads,
                                     const std::vector<at::Tensor>& inputs);
  // W: accumulates the gradients of every parameter the roots depend on into
  // .grad (hooks on them fire as in a full backward), then frees the graph.
  // Call once, after input_pass. before_weights (optional) is called before
  // each frontier node runs, with the parameters whose gradients it leads to
  // (ZeRO-3 gathers their units there: some weight-side kernels read the
  // parameter, e.g. layer norm's).
  void weight_pass(const std::function<void(const std::vector<at::Tensor>&)>& before_weights = {});

  // What the last input_pass found (for tests and the zb probe): frontier
  // nodes, X nodes whose saved tensors were freed, roots W starts from.
  struct Stats {
    int frontier_nodes = 0, released_nodes = 0, weight_roots = 0;
    bool whole_in_weight_pass = false;  // no root reached an input: W is the whole backward
  };
  const Stats& stats() const { return stats_; }

 private:
  struct State;
  std::unique_ptr<State> state_;
  Stats stats_;
};

}  // namespace smp
