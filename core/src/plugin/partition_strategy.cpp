#include "plugin/partition_strategy.h"

#include <smp/error.h>

#include "plugin/host_api.h"
#include "plugin/plugin_tables.h"

namespace smp {

std::vector<int> run_partition_strategy(const PluginRegistry& registry, const std::string& strategy,
                                        const PartitionRequest& request) {
  const smp_partition_strategy* p = PluginTables(registry).partitioner(strategy);
  if (!p) {
    std::string known;
    for (const auto& k : registry.partitioners()) known += (known.empty() ? "" : ", ") + k;
    throw Error("parallel.partition: no partition strategy '" + strategy + "' is loaded (known: " +
                (known.empty() ? "none" : known) + ")");
  }
  std::vector<smp_cost_node> nodes(request.nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const PartitionNode& n = request.nodes[i];
    nodes[i] = smp_cost_node{};
    nodes[i].struct_size = SMP_COST_NODE_STRUCT_SIZE;
    nodes[i].name = n.name.c_str();
    nodes[i].compute = n.compute;
    nodes[i].memory = n.memory;
    nodes[i].shared_key = n.shared_key.empty() ? nullptr : n.shared_key.c_str();
  }
  smp_cost_graph g{};
  g.struct_size = SMP_COST_GRAPH_STRUCT_SIZE;
  g.nodes = nodes.data();
  g.n_nodes = nodes.size();
  g.edge_src = request.edge_src.data();
  g.edge_dst = request.edge_dst.data();
  g.n_edges = request.edge_src.size();
  std::vector<int32_t> stages(nodes.size(), -1);
  smp_partition_request req{};
  req.struct_size = SMP_PARTITION_REQUEST_STRUCT_SIZE;
  req.graph = &g;
  req.num_stages = request.num_stages;
  req.options_json = request.options_json.c_str();
  req.tie_across_stages = request.tie_across_stages ? 1 : 0;
  req.stage_of_node = stages.data();
  throw_if_error(p->partition(p->state, &req),
                 "partition strategy '" + strategy + "' (plugin '" + registry.provider(strategy) + "')");
  return std::vector<int>(stages.begin(), stages.end());
}

}  // namespace smp
