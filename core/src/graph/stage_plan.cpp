#include <smp/stage_plan.h>

#include <smp/error.h>
#include <smp/plugin_registry.h>

#include "plugin/partition_strategy.h"

#include <set>

namespace smp {

StagePlan StagePlan::build(const ModelGraph& graph, std::vector<int> stage_of_node, int pp, int chunks) {
  StagePlan plan;
  plan.pp = pp;
  plan.chunks = chunks;
  const int S = pp * chunks;
  const size_t n = graph.nodes.size();
  if (stage_of_node.size() != n)
    throw Error("stage plan: " + std::to_string(stage_of_node.size()) + " stages for " + std::to_string(n) + " nodes");
  plan.stage_of_node = std::move(stage_of_node);
  plan.nodes_of_stage.assign(S, {});
  for (size_t i = 0; i < n; ++i) {
    int s = plan.stage_of_node[i];
    if (s < 0 || s >= S)
      throw Error("stage plan: node '" + graph.nodes[i].name + "' assigned to stage " + std::to_string(s) +
                  ", valid stages are 0.." + std::to_string(S - 1));
    plan.nodes_of_stage[s].push_back(static_cast<int>(i));
  }
  for (int s = 0; s < S; ++s)
    if (plan.nodes_of_stage[s].empty())
      throw Error("stage plan: stage " + std::to_string(s) + " has no nodes (" + std::to_string(n) + " nodes over " +
                  std::to_string(S) + " stages)");

  std::map<std::string, int> produced_on;
  std::map<std::string, int> last_use;
  std::set<std::string> graph_inputs(graph.inputs.begin(), graph.inputs.end());
  plan.inputs_of_stage.assign(S, {});
  for (size_t i = 0; i < n; ++i) {
    const auto& node = graph.nodes[i];
    int s = plan.stage_of_node[i];
    for (const auto& v : node.inputs) {
      if (graph_inputs.count(v)) {
        auto& ins = plan.inputs_of_stage[s];
        if (std::find(ins.begin(), ins.end(), v) == ins.end()) ins.push_back(v);
        continue;
      }
      int ps = produced_on.at(v);
      if (ps > s)
        throw Error("stage plan: node '" + node.name + "' on stage " + std::to_string(s) + " reads '" + v +
                    "' produced on later stage " + std::to_string(ps) + " (the partition must follow execution order)");
      last_use[v] = std::max(last_use[v], s);
    }
    for (const auto& v : node.outputs) produced_on[v] = s;
  }
  int loss_stage = produced_on.at(graph.loss);
  if (loss_stage != S - 1)
    throw Error("stage plan: the loss '" + graph.loss + "' is computed on stage " + std::to_string(loss_stage) +
                ", it must be on the last stage " + std::to_string(S - 1));
  // The loss count is read on the last stage, wherever it is computed.
  if (!graph.loss_count.empty()) last_use[graph.loss_count] = S - 1;
  plan.sent_after.assign(S, {});
  // Deterministic order: by producing node, then output position.
  for (size_t i = 0; i < n; ++i)
    for (const auto& v : graph.nodes[i].outputs) {
      auto it = last_use.find(v);
      if (it == last_use.end()) continue;
      for (int s = produced_on[v]; s < it->second; ++s) plan.sent_after[s].push_back(v);
    }
  return plan;
}

nlohmann::json StagePlan::to_json(const ModelGraph& graph) const {
  nlohmann::json stages = nlohmann::json::array();
  for (int s = 0; s < num_stages(); ++s) {
    nlohmann::json names = nlohmann::json::array();
    double compute = 0, memory = 0;
    for (int i : nodes_of_stage[s]) {
      names.push_back(graph.nodes[i].name);
      if (!costs.empty()) {
        compute += costs[i].compute;
        memory += costs[i].memory;
      }
    }
    stages.push_back({{"stage", s}, {"rank", rank_of(s)}, {"chunk", chunk_of(s)}, {"nodes", names},
                      {"sends", sent_after[s]}, {"compute", compute}, {"memory", memory}});
  }
  return stages;
}

bool costs_from_hints(const ModelGraph& graph, int64_t microbatch_samples, std::vector<NodeCost>& costs) {
  costs.assign(graph.nodes.size(), {});
  bool complete = true;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const auto& n = graph.nodes[i];
    if (n.flops_hint <= 0 && n.param_bytes_hint <= 0 && n.activation_bytes_hint <= 0) complete = false;
    costs[i].compute = 3.0 * n.flops_hint * static_cast<double>(microbatch_samples);
    costs[i].memory = 4.0 * n.param_bytes_hint + n.activation_bytes_hint * static_cast<double>(microbatch_samples);
  }
  return complete;
}

std::vector<int> run_partitioner(const PluginRegistry& registry, const std::string& strategy,
                                 const ModelGraph& graph, const std::vector<NodeCost>& costs, int num_stages,
                                 const nlohmann::json& options, bool tie_across_stages) {
  PartitionRequest req;
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    req.nodes.push_back({graph.nodes[i].name, graph.nodes[i].shared_key, costs[i].compute, costs[i].memory});
  auto producers = graph.producers();
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    for (const auto& v : graph.nodes[i].inputs) {
      int p_i = producers.at(v);
      if (p_i >= 0) {
        req.edge_src.push_back(p_i);
        req.edge_dst.push_back(static_cast<int64_t>(i));
      }
    }
  req.num_stages = num_stages;
  req.options_json = options.dump();
  req.tie_across_stages = tie_across_stages;
  return run_partition_strategy(registry, strategy, req);
}

}  // namespace smp
