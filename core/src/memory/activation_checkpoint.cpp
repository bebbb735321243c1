#include "memory/activation_checkpoint.h"

#include <smp/error.h>
#include <smp/model_graph.h>

#include <smp/common/checkpoint.hpp>

namespace smp {

std::vector<bool> select_checkpointed(const ModelGraph& graph, const std::vector<std::string>& entries, int every,
                                      const std::string& origin, const std::string& key) {
  auto matches = [](const GraphNode& n, const std::string& e) {
    return n.kind == e || n.name == e || n.name.rfind(e + ".", 0) == 0;
  };
  std::vector<bool> out(graph.nodes.size(), false);
  for (const auto& e : entries) {
    bool any = false;
    for (const auto& n : graph.nodes) any = any || matches(n, e);
    if (!any) {
      std::string kinds;
      for (const auto& n : graph.nodes)
        if (kinds.find("\"" + n.kind + "\"") == std::string::npos) kinds += (kinds.empty() ? "\"" : ", \"") + n.kind + "\"";
      throw Error(origin + ": " + key + ": \"" + e + "\" matches no node's kind, name or name prefix (kinds: " +
                  kinds + ")");
    }
  }
  int matched = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    bool hit = false;
    for (const auto& e : entries) hit = hit || matches(graph.nodes[i], e);
    if (hit) out[i] = matched++ % every == 0;
  }
  return out;
}

std::vector<at::Tensor> checkpointed(const ModuleCall& call, const std::vector<at::Tensor>& inputs,
                                     sdk::InputStash* stash) {
  return sdk::checkpointed(call, inputs, stash);
}

}  // namespace smp
