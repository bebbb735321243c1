#include <smp/model_graph.h>

#include "base/struct_size.h"

#include <smp/error.h>

#include "plugin/graph_builder.h"

#include <set>

namespace smp {

GraphBuilder& GraphBuilder::from(smp_graph_builder* b) {
  if (!b) throw Error("null graph builder");
  return *reinterpret_cast<GraphBuilder*>(b);
}

void GraphBuilder::add_input(const std::string& name) {
  if (name.empty()) throw Error("graph input with an empty name");
  graph_.inputs.push_back(name);
}

void GraphBuilder::add_node(const smp_graph_node* n) {
  if (!n) throw Error("graph_add_node: null node");
  require_struct_size(n, SMP_GRAPH_NODE_STRUCT_SIZE_2_0, "2.0", "graph_add_node: smp_graph_node");
  if (!n->name || !*n->name) throw Error("graph_add_node: node without a name");
  if (!n->kind || !*n->kind) throw Error(std::string("graph node '") + n->name + "' has no kind");
  GraphNode g;
  g.name = n->name;
  g.kind = n->kind;
  g.config_json = n->config_json && *n->config_json ? n->config_json : "{}";
  g.method = n->method && *n->method ? n->method : "forward";
  for (size_t i = 0; i < n->n_inputs; ++i) g.inputs.emplace_back(n->inputs[i] ? n->inputs[i] : "");
  for (size_t i = 0; i < n->n_outputs; ++i) g.outputs.emplace_back(n->outputs[i] ? n->outputs[i] : "");
  g.shared_key = n->shared_key ? n->shared_key : "";
  g.flops_hint = n->flops_hint;
  g.param_bytes_hint = n->param_bytes_hint;
  g.activation_bytes_hint = n->activation_bytes_hint;
  if (SMP_HAS_FIELD(n, smp_graph_node, attention_core_bytes_hint)) {
    g.activation_fp32_extra_bytes_hint = n->activation_fp32_extra_bytes_hint;
    g.attention_core_bytes_hint = n->attention_core_bytes_hint;
  }
  graph_.nodes.push_back(std::move(g));
}

void GraphBuilder::set_loss(const std::string& name) {
  graph_.loss = name;
  graph_.loss_reduction = ModelGraph::LossReduction::Mean;
  graph_.loss_count.clear();
}
void GraphBuilder::set_loss_sum(const std::string& sum, const std::string& count) {
  if (count.empty()) throw Error("graph_set_loss_sum: the loss '" + sum + "' needs a count value");
  graph_.loss = sum;
  graph_.loss_reduction = ModelGraph::LossReduction::Sum;
  graph_.loss_count = count;
}
void GraphBuilder::add_metric(const std::string& name, const std::string& sum, const std::string& count) {
  if (name.empty()) throw Error("graph_add_metric: empty metric name");
  if (sum.empty() || count.empty()) throw Error("graph_add_metric: metric '" + name + "' needs a sum and a count value");
  graph_.metrics.push_back({name, sum, count});
}

void GraphBuilder::set_throughput_unit(const std::string& unit, double per_sample) {
  if (unit.empty()) throw Error("graph_set_throughput_unit: empty unit name");
  if (!(per_sample > 0)) throw Error("graph_set_throughput_unit: " + unit + " per sample must be > 0");
  graph_.throughput_unit = unit;
  graph_.throughput_per_sample = per_sample;
}
void GraphBuilder::set_flops_per_sample(double flops) { graph_.flops_per_sample = flops; }
void GraphBuilder::split_sequence(int dim) {
  if (dim < 0) throw Error("split_sequence: dimension " + std::to_string(dim) + " must be >= 0");
  graph_.sequence_dim = dim;
}

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
