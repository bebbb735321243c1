#include "memory/memory_model.h"

#include "schedule/schedule.h"

#include <algorithm>
#include <map>
#include <string>

namespace smp {

namespace {

// The hints are this rank's share already (parallel rules scale them).
double param_elements(const GraphNode& n) { return n.param_bytes_hint / 4.0; }  // hints are fp32 bytes

// Bytes of parameter state per parameter element held.
struct StateBytes {
  double parameters, gradients, optimizer;
};

StateBytes state_bytes(const MemoryModelOptions& o) {
  StateBytes s;
  s.parameters = o.zero == 3 ? static_cast<double>(o.compute_bytes) / o.dp : o.compute_bytes;
  s.gradients = o.grad_bytes;  // the accumulation buckets, whole at every stage (the reduced shard is a slice)
  s.optimizer = (8.0 + (o.masters ? 4.0 : 0.0)) / (o.zero >= 1 ? o.dp : 1);
  return s;
}

// Activation bytes of one node for one microbatch, in the compute dtype: all
// it keeps for backward, or, checkpointed, only its input, taken to be one
// hidden state: the smallest activation any node of the graph reports.
struct NodeActivations {
  double kept = 0, full = 0;
  double core = 0;  // recomputed in backward (attention core only)
  bool offloaded = false;  // kept is in host memory (a checkpointed input under memory.offload)
};

double activation_scale(const MemoryModelOptions& o) {
  return static_cast<double>(o.microbatch_samples) * o.compute_bytes / 4.0;  // hints are fp32 bytes per sample
}

// One hidden state of a microbatch: the smallest activation any node reports.
double hidden_state_bytes(const ModelGraph& graph, const MemoryModelOptions& o) {
  double hidden = 0;
  for (const auto& n : graph.nodes)
    if (n.activation_bytes_hint > 0 && (hidden == 0 || n.activation_bytes_hint < hidden)) hidden = n.activation_bytes_hint;
  return hidden * activation_scale(o);
}

std::vector<NodeActivations> node_activations(const ModelGraph& graph, const MemoryModelOptions& o) {
  const double hidden = hidden_state_bytes(graph, o), scale = activation_scale(o);
  std::vector<NodeActivations> out(graph.nodes.size());
  const bool sixteen_bit = o.compute_bytes < 4;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const GraphNode& n = graph.nodes[i];
    const double extra = sixteen_bit ? n.activation_fp32_extra_bytes_hint * o.microbatch_samples : 0.0;
    const double full = n.activation_bytes_hint * scale + extra;
    out[i].full = full;
    const bool ckpt = o.checkpoint.size() > i && o.checkpoint[i];
    const bool core = !ckpt && o.recompute_core.size() > i && o.recompute_core[i];
    if (core) out[i].core = std::min(full, n.attention_core_bytes_hint * scale + extra);
    out[i].kept = ckpt ? std::min(full, hidden) : full - out[i].core;
    out[i].offloaded = ckpt && o.offload;
  }
  return out;
}

}  // namespace

std::vector<NodeCost> memory_costs(const ModelGraph& graph, const MemoryModelOptions& o, std::vector<NodeCost> costs) {
  const StateBytes s = state_bytes(o);
  const auto acts = node_activations(graph, o);
  costs.resize(graph.nodes.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    costs[i].memory = param_elements(graph.nodes[i]) * (s.parameters + s.gradients + s.optimizer) +
                      (acts[i].offloaded ? 0.0 : acts[i].kept);
  return costs;
}

std::vector<RankMemory> estimate_memory(const ModelGraph& graph, const StagePlan& plan, const Schedule& schedule,
                                        const MemoryModelOptions& o) {
  const StateBytes s = state_bytes(o);
  const auto acts = node_activations(graph, o);
  const double hidden = hidden_state_bytes(graph, o);
  // The loss node keeps what it was given (a language model's logits, or
  // their log-softmax); its backward makes that tensor's gradient and one
  // more of its size, where a vocabulary larger than the hidden size makes
  // them the step's largest.
  const auto producers = graph.producers();
  const auto loss_at = producers.find(graph.loss);
  const int loss_node = loss_at == producers.end() ? -1 : loss_at->second;
  // A shared module's parameters are hinted on one of its nodes (GPT's tied
  // embedding: on the embedding, not the LM head); every rank holding the module counts them.
  std::map<std::string, double> module_elements;
  for (const auto& n : graph.nodes)
    module_elements[n.module_key()] = std::max(module_elements[n.module_key()], param_elements(n));
  std::vector<RankMemory> out;
  for (int r = 0; r < plan.pp; ++r) {
    RankMemory m;
    m.pp_rank = r;
    // Parameter state: each module once per rank, whichever chunks use it.
    std::map<std::string, double> units;  // module key -> parameter elements
    std::vector<double> kept(plan.chunks, 0), working(plan.chunks, 0), offloaded(plan.chunks, 0);
    for (int c = 0; c < plan.chunks; ++c) {
      double recompute = 0;
      const int stage = c * plan.pp + r;
      for (int idx : plan.nodes_of_stage[stage]) {
        const GraphNode& n = graph.nodes[idx];
        units[n.module_key()] = module_elements.at(n.module_key());
        (acts[idx].offloaded ? offloaded[c] : kept[c]) += acts[idx].kept;
        if (o.checkpoint.size() > static_cast<size_t>(idx) && o.checkpoint[idx])
          recompute = std::max(recompute, acts[idx].full);
        recompute = std::max(recompute, acts[idx].core);
      }
      // Backward frees activations as it goes; on top of them it holds the
      // gradient flowing through the stage (about two hidden states) and the
      // activations of the checkpointed node it is recomputing.
      working[c] = recompute + 2 * hidden;
      for (int idx : plan.nodes_of_stage[stage])
        if (idx == loss_node) working[c] = std::max(working[c], 2 * acts[idx].full);
      // A stage that sends its output on keeps it until its gradient comes back
      // (no operation of the stage saved it): one more hidden state per value.
      if (stage + 1 < plan.num_stages()) kept[c] += hidden * static_cast<double>(plan.sent_after[stage].size());
      // A stage that received its input sends that input's gradient back from
      // its backward: one more hidden state per value, held while it is sent.
      if (stage > 0) working[c] += hidden * static_cast<double>(plan.sent_after[stage - 1].size());
    }
    double elements = 0, largest_unit = 0;
    for (const auto& [key, e] : units) {
      elements += e;
      largest_unit = std::max(largest_unit, e);
    }
    m.parameters = elements * s.parameters;
    m.gradients = elements * s.gradients;
    m.optimizer_state = elements * s.optimizer;
    // Activations: walk this rank's actions. Offloaded inputs are on the host
    // from their forward to their backward, but for the slots loaded back
    // ahead (the one in backward and `horizon` more, of those in flight).
    double live = 0, peak = 0, host = 0, host_peak = 0;
    int in_flight = 0;
    for (const Action& a : schedule.actions.at(r)) {
      if (a.op == Op::Forward) {
        live += kept[a.chunk];
        host += offloaded[a.chunk];
        host_peak = std::max(host_peak, host);
        ++in_flight;
        peak = std::max(peak, live);
      } else if (a.op == Op::Backward || a.op == Op::BackwardInput || a.op == Op::BackwardWeight) {
        const int loaded = std::min(in_flight, o.offload_horizon + 1);
        peak = std::max(peak, live + working[a.chunk] + loaded * offloaded[a.chunk]);
        if (a.op != Op::BackwardInput) {
          live -= kept[a.chunk];
          host -= offloaded[a.chunk];
          --in_flight;
        }
      }
    }
    m.offloaded = host_peak;
    // ZeRO-3: the unit in use, the one prefetched, and in backward the one
    // before, held until its gradients are in (how long depends on the gradient
    // reduction, so three is the bound, not always reached).
    if (o.zero == 3) peak += 3 * largest_unit * o.compute_bytes;
    m.step_peak = peak;
    out.push_back(m);
  }
  return out;
}

nlohmann::json to_json(const RankMemory& m) {
  return {{"pp_rank", m.pp_rank},      {"parameters", m.parameters}, {"gradients", m.gradients},
          {"optimizer_state", m.optimizer_state}, {"step_peak", m.step_peak}, {"total", m.total()},
          {"offloaded_host", m.offloaded}};
}

}  // namespace smp
