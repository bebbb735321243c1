// ModelGraph's checks and indexes: a value type any layer may use (the plugin
// layer builds one from an adapter's describe(), graph/ rewrites and plans it).
#include <smp/model_graph.h>

#include <smp/error.h>

#include <set>

namespace smp {

void ModelGraph::validate(const std::string& adapter) const {
  const std::string where = "model graph of adapter '" + adapter + "'";
  std::set<std::string> produced, names;
  for (const auto& in : inputs)
    if (!produced.insert(in).second) throw Error(where + ": input '" + in + "' declared twice");
  std::map<std::string, const GraphNode*> shared;
  for (const auto& n : nodes) {
    if (!names.insert(n.name).second) throw Error(where + ": node name '" + n.name + "' used twice");
    if (n.outputs.empty()) throw Error(where + ": node '" + n.name + "' has no outputs");
    for (const auto& v : n.inputs)
      if (!produced.count(v))
        throw Error(where + ": node '" + n.name + "' reads value '" + v +
                    "' before any node or input produces it (nodes must be in execution order)");
    for (const auto& v : n.outputs)
      if (!produced.insert(v).second) throw Error(where + ": value '" + v + "' produced twice (by '" + n.name + "')");
    if (!n.shared_key.empty()) {
      auto [it, fresh] = shared.emplace(n.shared_key, &n);
      if (!fresh && (it->second->kind != n.kind || it->second->config_json != n.config_json))
        throw Error(where + ": nodes '" + it->second->name + "' and '" + n.name + "' share key '" + n.shared_key +
                    "' but differ in kind or config");
    }
  }
  std::set<std::string> metric_names;
  for (const auto& m : metrics) {
    if (!metric_names.insert(m.name).second) throw Error(where + ": metric '" + m.name + "' declared twice");
    auto p = producers();
    auto s = p.find(m.sum), c = p.find(m.count);
    if (s == p.end() || s->second < 0)
      throw Error(where + ": metric '" + m.name + "': value '" + m.sum + "' is not produced by a node");
    if (c == p.end() || c->second != s->second)
      throw Error(where + ": metric '" + m.name + "': count value '" + m.count +
                  "' must be an output of the node producing '" + m.sum + "'");
  }
  if (loss.empty()) throw Error(where + ": no loss value set (graph_set_loss)");
  if (!produced.count(loss)) throw Error(where + ": loss value '" + loss + "' is never produced");
  if (loss_reduction == LossReduction::Sum) {
    // The count may come from any node (the stage plan carries it to the last
    // stage, where the loss is): e.g. one term's count for a sum of loss terms
    // the adapter has weighted itself. Not a graph input: a batch tensor is not a count.
    auto p = producers();
    auto c = p.find(loss_count);
    if (c == p.end()) throw Error(where + ": loss count value '" + loss_count + "' is never produced");
    if (c->second < 0)
      throw Error(where + ": loss count value '" + loss_count + "' is a graph input; it must be a node's output");
  }
}

std::map<std::string, int> ModelGraph::producers() const {
  std::map<std::string, int> p;
  for (const auto& in : inputs) p[in] = -1;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const auto& v : nodes[i].outputs) p[v] = static_cast<int>(i);
  return p;
}

std::vector<std::vector<int>> ModelGraph::consumers() const {
  auto prod = producers();
  std::vector<std::vector<int>> c(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const auto& v : nodes[i].inputs) {
      int p = prod.at(v);
      if (p >= 0 && (c[p].empty() || c[p].back() != static_cast<int>(i))) c[p].push_back(static_cast<int>(i));
    }
  return c;
}

}  // namespace smp
