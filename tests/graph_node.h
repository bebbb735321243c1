// A ModelGraph node for tests, the way an adapter would describe it.
#pragma once

#include <smp/model_graph.h>

#include <string>
#include <utility>
#include <vector>

namespace smp_test {

inline smp::GraphNode node(const std::string& name, const std::string& kind, const std::string& config,
                           std::vector<std::string> inputs, std::vector<std::string> outputs,
                           const std::string& shared_key = "") {
  smp::GraphNode n;
  n.name = name, n.kind = kind, n.config_json = config, n.method = "forward";
  n.inputs = std::move(inputs), n.outputs = std::move(outputs), n.shared_key = shared_key;
  return n;
}

}  // namespace smp_test
