// The model as an adapter describes it: a DAG of module calls over named values.
#pragma once

#include <map>
#include <string>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

struct GraphNode {
  std::string name;        // hierarchical, dots give the module tree
  std::string kind;        // module kind (rewritten by TP rules when tp > 1)
  std::string config_json;
  std::string method;      // "forward" unless the node calls another method of a shared module
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::string shared_key;  // nodes with the same key share one module and its parameters
  double flops_hint = 0;
  double param_bytes_hint = 0;
  double activation_bytes_hint = 0;
  double activation_fp32_extra_bytes_hint = 0;  // ABI 2.2 (see smp_graph_node)
  double attention_core_bytes_hint = 0;         // ABI 2.2

  // The key a module instance is created under: the shared key, or the node's name.
  const std::string& module_key() const { return shared_key.empty() ? name : shared_key; }
};

struct ModelGraph {
  std::vector<std::string> inputs;  // values fed by the adapter's batch(), in order
  std::vector<GraphNode> nodes;     // in execution (topological) order
  std::string loss;                 // the scalar value backward starts from
  // How `loss` is normalised: a per-sample mean, or a sum over `loss_count`'s
  // items (a scalar output of any node: the stage plan carries it to the last stage). The runtime turns both into
  // one global mean over the step, in one place (train/loss_normalizer).
  enum class LossReduction { Mean, Sum };
  LossReduction loss_reduction = LossReduction::Mean;
  std::string loss_count;           // Sum only
  // Validation metrics (ABI 2.2): reported as the sum of `sum` over the count
  // of `count`, both scalar outputs of one node.
  struct Metric {
    std::string name, sum, count;
  };
  std::vector<Metric> metrics;
  double flops_per_sample = 0;      // training FLOPs per sample (forward + backward), 0 = unknown
  // What throughput is counted in, per sample ("tokens" x seq_len, "samples" x 1).
  std::string throughput_unit = "samples";
  double throughput_per_sample = 1;
  // The dimension of every input along which the adapter's batch() cuts each
  // sample's sequence on a sequence axis (ABI 2.8's split_sequence); -1: it
  // does not, and a job with a sequence axis refuses the graph.
  int sequence_dim = -1;

  // Throws smp::Error naming the node and value when the graph is not a valid DAG
  // in the given order (value used before produced, produced twice, duplicate
  // node names, missing loss, shared nodes whose kinds differ, a loss count
  // that another node than the loss's produces).
  void validate(const std::string& adapter_name) const;

  // value name -> index of the producing node (-1 for graph inputs)
  std::map<std::string, int> producers() const;
  // For each node, the indices of nodes consuming its outputs.
  std::vector<std::vector<int>> consumers() const;
};

}  // namespace smp
#pragma GCC visibility pop
