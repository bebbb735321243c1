// "balanced": exact contiguous split of the execution order that minimises the
// maximum stage cost (min-max DP over the tied-node units, O(n^2 * stages)).
// Cost = compute by default; options optimize / memory_weight as for "tree".
#include "partition_algorithms.h"

#include <smp/sdk/host.hpp>

namespace smp::partition {

std::vector<int> balanced_partition(const PartitionRequest& r) {
  validate_request(r, "balanced");
  expect_options(r, {"optimize", "memory_weight"}, "balanced");
  const double w = resolve_memory_weight(r.options, 0.0);
  const std::vector<double> cost = node_costs(r.graph, w);
  const auto units = atoms(r);
  check_atom_count(r, units, "balanced");
  std::vector<double> unit_cost(units.size(), 0.0);
  for (size_t u = 0; u < units.size(); ++u)
    for (int i = units[u].first; i <= units[u].second; ++i) unit_cost[u] += cost[i];
  const std::vector<int> unit_stage = min_max_split(unit_cost, r.num_stages);
  std::vector<int> stage(r.graph.nodes.size(), 0);
  for (size_t u = 0; u < units.size(); ++u)
    for (int i = units[u].first; i <= units[u].second; ++i) stage[i] = unit_stage[u];
  check_partition(r, stage, "balanced");
  return stage;
}

}  // namespace smp::partition
