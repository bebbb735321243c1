// C++ partition strategies over the ABI. No LibTorch needed.
#pragma once

#include <smp/abi.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace smp::sdk {

struct CostNode {
  std::string name;
  double compute = 0;
  double memory = 0;
  std::string shared_key;  // empty = none
};

struct CostGraph {
  std::vector<CostNode> nodes;  // execution order
  std::vector<std::pair<int64_t, int64_t>> edges;

  static CostGraph from(const smp_cost_graph* g) {
    CostGraph c;
    for (size_t i = 0; i < g->n_nodes; ++i) {
      const smp_cost_node& n = g->nodes[i];
      c.nodes.push_back({n.name ? n.name : "", n.compute, n.memory, n.shared_key ? n.shared_key : ""});
    }
    for (size_t i = 0; i < g->n_edges; ++i) c.edges.emplace_back(g->edge_src[i], g->edge_dst[i]);
    return c;
  }
};

struct PartitionRequest {
  CostGraph graph;
  int num_stages = 1;
  nlohmann::json options = nlohmann::json::object();
  bool tie_across_stages = false;
};

// A partition strategy: returns the stage of each node.
using PartitionFn = std::vector<int> (*)(const PartitionRequest& request);

}  // namespace smp::sdk
