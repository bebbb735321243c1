#include "graph/profiler.h"

#include <smp/error.h>
#include <smp/plugin_registry.h>

#include "plugin/module_instance.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <map>

namespace smp {

std::vector<NodeCost> profile_costs(const ModelGraph& graph, const PluginRegistry& registry,
                                    const std::function<std::vector<at::Tensor>(int)>& batch, uint64_t seed) {
  std::vector<NodeCost> costs(graph.nodes.size());
  std::map<std::string, at::Tensor> env;
  auto inputs = batch(0);
  for (size_t i = 0; i < graph.inputs.size() && i < inputs.size(); ++i) env[graph.inputs[i]] = inputs[i];
  std::map<std::string, int> last_user;
  for (size_t i = 0; i < graph.nodes.size(); ++i) last_user[graph.nodes[i].module_key()] = static_cast<int>(i);
  std::map<std::string, std::unique_ptr<ModuleInstance>> live;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const GraphNode& node = graph.nodes[i];
    auto& m = live[node.module_key()];
    if (!m) {
      // One rank (a null mesh): every axis has size 1.
      ModuleSetup setup;
      setup.init_seed = seed;
      m = std::make_unique<ModuleInstance>(registry, node.kind, node.module_key(), node.config_json, setup);
    }
    std::vector<at::Tensor> ins;
    for (const auto& v : node.inputs) {
      at::Tensor t = env.at(v).detach();
      if (t.is_floating_point()) t.requires_grad_(true);
      ins.push_back(t);
    }
    // Forward, then backward through this node alone with ones as the output
    // gradient, twice: the first call warms up (allocations, lazy init, the
    // first-call costs of the kernels) and only the second is counted.
    // A module the program handed over is the one it trains: its buffers
    // (running statistics) get the profile's calls undone below.
    std::vector<std::pair<at::Tensor, at::Tensor>> buffers;
    for (const auto& p : m->parameters())
      if (p.buffer) buffers.emplace_back(p.tensor, p.tensor.clone());
    std::vector<at::Tensor> outs;
    double fwd = 0, bwd = 0;
    for (int round = 0; round < 2; ++round) {
      auto t0 = std::chrono::steady_clock::now();
      outs = m->call(node.name, node.method, ins, node.outputs.size(), true, seed);
      fwd = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<at::Tensor> roots, grads;
      for (auto& o : outs)
        if (o.requires_grad()) {
          roots.push_back(o);
          grads.push_back(at::ones_like(o));
        }
      bwd = 2 * fwd;
      if (!roots.empty()) {
        auto t1 = std::chrono::steady_clock::now();
        torch::autograd::backward(roots, grads);
        bwd = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      }
    }
    // A module the program handed over is the one it trains: leave no gradient behind.
    for (const auto& p : m->parameters())
      if (p.tensor.grad().defined()) p.tensor.mutable_grad().reset();
    for (auto& t : ins)
      if (t.grad().defined()) t.mutable_grad().reset();
    {
      c10::NoGradGuard no_grad;
      for (auto& [live, before] : buffers) live.copy_(before);
    }
    double param_bytes = 0, buffer_bytes = 0, act_bytes = 0;
    for (const auto& p : m->parameters())
      (p.buffer ? buffer_bytes : param_bytes) += static_cast<double>(p.tensor.numel() * p.tensor.element_size());
    for (auto& o : outs) act_bytes += o.numel() * o.element_size();
    costs[i].compute = fwd + bwd;
    costs[i].memory = 4 * param_bytes + buffer_bytes + act_bytes;
    for (size_t k = 0; k < outs.size(); ++k) env[node.outputs[k]] = outs[k].detach();
    if (last_user[node.module_key()] == static_cast<int>(i)) live.erase(node.module_key());
  }
  return costs;
}

}  // namespace smp
