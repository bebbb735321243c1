#include "graph/stage_balance.h"

#include <cstdio>

namespace smp {

namespace {

bool produces(const GraphNode& n, const std::string& value) {
  for (const auto& o : n.outputs)
    if (o == value) return true;
  return false;
}

}  // namespace

std::string stage_balance_warning(const ModelGraph& graph, const StagePlan& plan) {
  const int stages = plan.num_stages();
  if (stages < 2) return "";
  const std::string advice =
      ": the pipeline runs about serially. Hand the model over as more nodes (TorchModel::sequential, or "
      "TorchModel::node per block) or set the partition yourself ([partition])";
  for (int s = 0; s < stages; ++s) {
    const auto& nodes = plan.nodes_of_stage[s];
    bool only_loss = !nodes.empty();
    for (int i : nodes) only_loss = only_loss && produces(graph.nodes[i], graph.loss);
    if (only_loss)
      return "stage " + std::to_string(s) + " holds only the loss node '" + graph.nodes[nodes.front()].name + "'" +
             advice;
  }
  if (plan.costs.size() != graph.nodes.size()) return "";
  double total = 0;
  std::vector<double> per_stage(stages, 0.0);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    per_stage[plan.stage_of_node[i]] += plan.costs[i].compute;
    total += plan.costs[i].compute;
  }
  if (!(total > 0)) return "";
  for (int s = 0; s < stages; ++s)
    if (per_stage[s] >= kStageCostShareWarning * total) {
      char share[32];
      std::snprintf(share, sizeof share, "%.0f%%", 100.0 * per_stage[s] / total);
      return "stage " + std::to_string(s) + " holds " + share + " of the model's compute (" +
             std::to_string(plan.nodes_of_stage[s].size()) + " of " + std::to_string(graph.nodes.size()) + " nodes)" +
             advice;
    }
  return "";
}

}  // namespace smp
