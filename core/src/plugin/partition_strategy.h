// A loaded plugin's partition strategy (smp_partition_strategy), in C++: nodes
// with their costs and the edges between them in, a stage per node out.
// graph/'s run_partitioner builds the input from the model graph.
#pragma once

#include <smp/plugin_registry.h>

#include <cstdint>
#include <string>
#include <vector>

namespace smp {

struct PartitionNode {
  std::string name, shared_key;  // shared_key: tied weights ("" none)
  double compute = 0, memory = 0;
};

struct PartitionRequest {
  std::vector<PartitionNode> nodes;
  std::vector<int64_t> edge_src, edge_dst;  // edge i: node edge_src[i] produces a value node edge_dst[i] reads
  int num_stages = 1;
  std::string options_json = "{}";  // the job's [partition] table
  bool tie_across_stages = false;
};

// The stage of each node. Throws naming the strategy and its plugin (and the
// loaded strategies when `strategy` is not one of them).
std::vector<int> run_partition_strategy(const PluginRegistry& registry, const std::string& strategy,
                                        const PartitionRequest& request);

}  // namespace smp
