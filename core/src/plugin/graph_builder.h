// Collects an adapter's describe() calls into a ModelGraph (behind smp_graph_builder).
#pragma once

#include <smp/abi.h>
#include <smp/model_graph.h>

#include <string>

namespace smp {

class GraphBuilder {
 public:
  static GraphBuilder& from(smp_graph_builder* b);
  smp_graph_builder* handle() { return reinterpret_cast<smp_graph_builder*>(this); }

  void add_input(const std::string& name);
  void add_node(const smp_graph_node* node);
  void set_loss(const std::string& name);
  void set_flops_per_sample(double flops);
  void set_loss_sum(const std::string& sum, const std::string& count);
  void set_throughput_unit(const std::string& unit, double per_sample);
  void split_sequence(int dim);
  void add_metric(const std::string& name, const std::string& sum, const std::string& count);

  ModelGraph& graph() { return graph_; }

 private:
  ModelGraph graph_;
};

}  // namespace smp
