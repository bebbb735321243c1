#include "pipeline/backward_split.h"

#include <smp/error.h>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace smp {

namespace {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

constexpr uint8_t kReachesInput = 1;
constexpr uint8_t kReachesParameter = 2;

// What the frontier nodes received in B. Shared with the hooks, which the
// graph's nodes own (they may outlive the split).
struct Captures {
  bool armed = true;                 // B records; W runs the nodes again and must not
  std::vector<variable_list> grads;  // by frontier index
  // W: called before a frontier node runs, with the parameters it leads to.
  std::vector<std::vector<at::Tensor>> parameters;  // by frontier index
  std::function<void(const std::vector<at::Tensor>&)> before_weights;
};

class CaptureHook final : public torch::autograd::FunctionPreHook {
 public:
  CaptureHook(std::shared_ptr<Captures> captures, size_t index) : captures_(std::move(captures)), index_(index) {}
  variable_list operator()(const variable_list& grads) override {
    if (captures_->armed)
      captures_->grads[index_] = grads;
    else if (captures_->before_weights)
      captures_->before_weights(captures_->parameters[index_]);
    return grads;
  }

 private:
  std::shared_ptr<Captures> captures_;
  size_t index_;
};

// The graph below the roots, children before parents, with what each node reaches.
struct GraphScan {
  std::vector<std::shared_ptr<Node>> post_order;
  std::unordered_map<const Node*, uint8_t> reaches;

  uint8_t of(const Node* n) const {
    auto it = reaches.find(n);
    return it == reaches.end() ? 0 : it->second;
  }
};

GraphScan scan(const edge_list& roots, const std::unordered_set<const Node*>& input_accumulators) {
  GraphScan g;
  std::unordered_set<const Node*> seen;
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack;  // node, next edge to visit
  for (const Edge& r : roots) {
    if (!r.is_valid() || !seen.insert(r.function.get()).second) continue;
    stack.emplace_back(r.function, 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->num_outputs()) {
        const Edge& e = node->next_edge(next++);
        if (e.is_valid() && seen.insert(e.function.get()).second) stack.emplace_back(e.function, 0);
        continue;
      }
      uint8_t r = 0;
      if (input_accumulators.count(node.get()))
        r = kReachesInput;
      else if (dynamic_cast<const torch::autograd::AccumulateGrad*>(node.get()))
        r = kReachesParameter;
      else
        for (const Edge& e : node->next_edges())
          if (e.is_valid()) r |= g.of(e.function.get());
      g.reaches[node.get()] = r;
      g.post_order.push_back(node);
      stack.pop_back();
    }
  }
  return g;
}

bool reaches_only_parameters(uint8_t r) { return (r & kReachesParameter) && !(r & kReachesInput); }

// The parameters a frontier node's weight side leads to.
std::vector<at::Tensor> parameters_below(const Node& frontier, const GraphScan& g) {
  std::vector<at::Tensor> out;
  std::unordered_set<const Node*> seen;
  std::vector<const Node*> todo;
  for (const Edge& e : frontier.next_edges())
    if (e.is_valid() && reaches_only_parameters(g.of(e.function.get())) && seen.insert(e.function.get()).second)
      todo.push_back(e.function.get());
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (const auto* acc = dynamic_cast<const torch::autograd::AccumulateGrad*>(n)) {
      out.push_back(acc->variable);
      continue;
    }
    for (const Edge& e : n->next_edges())
      if (e.is_valid() && (g.of(e.function.get()) & kReachesParameter) && seen.insert(e.function.get()).second)
        todo.push_back(e.function.get());
  }
  return out;
}

}  // namespace

struct BackwardSplit::State {
  std::vector<std::shared_ptr<Node>> frontier;
  std::shared_ptr<Captures> captures = std::make_shared<Captures>();
  edge_list parameter_roots;     // roots that reach no stage input: W starts there too
  variable_list parameter_root_grads;
  edge_list accumulators;        // the parameters' AccumulateGrad nodes: W's targets
  bool input_done = false, weight_done = false;
};

BackwardSplit::BackwardSplit() : state_(std::make_unique<State>()) {}
BackwardSplit::~BackwardSplit() = default;

std::vector<at::Tensor> BackwardSplit::input_pass(const std::vector<at::Tensor>& roots,
                                                  const std::vector<at::Tensor>& grads,
                                                  const std::vector<at::Tensor>& inputs) {
  State& s = *state_;
  if (s.input_done) throw Error("BackwardSplit::input_pass called twice (internal error)");
  s.input_done = true;
  edge_list root_edges;
  for (const auto& r : roots) root_edges.push_back(torch::autograd::impl::gradient_edge(r));
  std::unordered_set<const Node*> input_accumulators;
  for (const auto& x : inputs)
    if (x.requires_grad()) input_accumulators.insert(torch::autograd::impl::gradient_edge(x).function.get());
  const GraphScan g = scan(root_edges, input_accumulators);
  bool any_input_reached = false;
  for (const Edge& e : root_edges) any_input_reached = any_input_reached || (g.of(e.function.get()) & kReachesInput);
  // Nothing here leads to a received activation (a first stage): there is no
  // input gradient to compute, B does nothing and W runs the whole backward
  // (every root is then a weight root). The ZB-H1 plan counts such a stage's
  // microbatches as holding their activations until W (schedule.h).
  stats_.whole_in_weight_pass = !any_input_reached;

  std::unordered_set<const Node*> frontier;
  for (const auto& node : g.post_order) {
    const uint8_t r = g.of(node.get());
    if (dynamic_cast<const torch::autograd::AccumulateGrad*>(node.get())) {
      if (r == kReachesParameter) s.accumulators.emplace_back(node, 0);
      continue;
    }
    if (!(r & kReachesInput)) continue;
    for (const Edge& e : node->next_edges())
      if (e.is_valid() && reaches_only_parameters(g.of(e.function.get()))) {
        frontier.insert(node.get());
        s.frontier.push_back(node);
        s.captures->parameters.push_back(parameters_below(*node, g));
        node->add_pre_hook(std::make_unique<CaptureHook>(s.captures, s.frontier.size() - 1));
        break;
      }
  }
  s.captures->grads.resize(s.frontier.size());
  for (size_t i = 0; i < roots.size(); ++i)
    if (reaches_only_parameters(g.of(root_edges[i].function.get()))) {
      s.parameter_roots.push_back(root_edges[i]);
      s.parameter_root_grads.push_back(grads[i]);
    }

  std::vector<at::Tensor> input_grads(inputs.size());
  if (any_input_reached) {
    // Only the X nodes run, each computing its outputs toward X; the graph
    // stays for W.
    std::vector<at::Tensor> reached_roots, reached_grads;
    for (size_t i = 0; i < roots.size(); ++i)
      if (g.of(root_edges[i].function.get()) & kReachesInput) {
        reached_roots.push_back(roots[i]);
        reached_grads.push_back(grads[i]);
      }
    std::vector<at::Tensor> wanted;
    std::vector<size_t> wanted_at;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].requires_grad()) {
        wanted.push_back(inputs[i]);
        wanted_at.push_back(i);
      }
    auto got = torch::autograd::grad(reached_roots, wanted, reached_grads, /*retain_graph=*/true,
                                     /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < got.size(); ++k) input_grads[wanted_at[k]] = got[k];
  }
  s.captures->armed = false;

  // W must not run X again: the frontier's edges into X go, and the other X
  // nodes' saved tensors (read by nothing after B) are freed now rather than
  // with the graph.
  for (const auto& node : s.frontier)
    for (Edge& e : node->next_edges())
      if (e.is_valid() && (g.of(e.function.get()) & kReachesInput)) e = Edge();
  for (const auto& node : g.post_order)
    if ((g.of(node.get()) & kReachesInput) && !frontier.count(node.get()) && !input_accumulators.count(node.get()) &&
        !dynamic_cast<const torch::autograd::AccumulateGrad*>(node.get())) {
      node->release_variables();
      ++stats_.released_nodes;
    }
  stats_.frontier_nodes = static_cast<int>(s.frontier.size());
  return input_grads;
}

void BackwardSplit::weight_pass(const std::function<void(const std::vector<at::Tensor>&)>& before_weights) {
  State& s = *state_;
  if (!s.input_done || s.weight_done) throw Error("BackwardSplit::weight_pass out of order (internal error)");
  s.weight_done = true;
  s.captures->before_weights = before_weights;
  edge_list root_edges = s.parameter_roots;
  variable_list root_grads = s.parameter_root_grads;
  for (size_t i = 0; i < s.frontier.size(); ++i) {
    const variable_list& got = s.captures->grads[i];
    for (size_t k = 0; k < got.size(); ++k)
      if (got[k].defined()) {
        root_edges.emplace_back(s.frontier[i], static_cast<uint32_t>(k));
        root_grads.push_back(got[k]);
      }
  }
  stats_.weight_roots = static_cast<int>(root_edges.size());
  if (!root_edges.empty() && !s.accumulators.empty())
    torch::autograd::Engine::get_default_engine().execute(root_edges, root_grads, /*keep_graph=*/false,
                                                          /*create_graph=*/false, /*accumulate_grad=*/true,
                                                          s.accumulators);
  // The graph goes with the last references to it.
  s.captures->before_weights = nullptr;
  s.captures->parameters.clear();
  s.captures->grads.clear();
  s.frontier.clear();
  s.parameter_roots.clear();
  s.parameter_root_grads.clear();
  s.accumulators.clear();
}

}  // namespace smp
