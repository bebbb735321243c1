#include "plugin/graph_builder.h"

#include <smp/error.h>

#include "plugin/struct_size.h"

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

}  // namespace smp
