// A cluster as the planner sees it (smp-plan --cluster): the accelerator (peak
// FLOP/s per dtype, memory and its bandwidth, the fraction of peak a GEMM
// achieves by its size), the node, the two links (inside a node, between
// nodes) as α-β costs, and which mesh axes a node holds first. Read from TOML;
// a missing, mistyped or contradictory key is refused naming the file and key.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace smp::plan {

struct Link {
  double bandwidth = 0;  // bytes/s per accelerator, as a ring collective's bus bandwidth
  double latency = 0;    // seconds per message (per ring step)
};

struct Cluster {
  std::string name, file;
  std::string accelerator;
  double memory_bytes = 0;
  double memory_bandwidth = 0;                 // bytes/s
  // The rate of the elementwise passes (norms, activations, softmax, the
  // optimizer) in bytes/s as the step model counts them: the memory bandwidth
  // on a GPU (accelerator.elementwise_gbs absent), less on a CPU core, where
  // exp, erf and tanh cost more than the bytes they move.
  double elementwise_bandwidth = 0;
  // Host time per operator that the accelerator does not hide (seconds;
  // accelerator.op_overhead_us, default 0): a CPU runs each operator's
  // dispatch in line with its work; a GPU's asynchronous launches overlap it.
  double op_overhead = 0;
  std::map<std::string, double> peak_flops;    // by dtype ("fp16", "bf16", "fp32")
  std::vector<std::pair<double, double>> gemm_efficiency;  // (smallest GEMM dimension, fraction of peak), rising sizes
  int node_size = 1;                           // accelerators per node
  Link intra, inter;
  // The all-to-all's own costs when the implementation takes another path for
  // it than the axis' link ([links.alltoall]; smp on CPUs: Gloo, while the
  // other collectives go through shared memory); absent: the axis' link.
  Link alltoall;
  bool has_alltoall = false;
  std::vector<std::string> inside_node;        // axes placed inside a node first, in this order

  // The fraction of peak a GEMM whose smallest dimension is `size` achieves:
  // the table interpolated in log(size), held flat past its ends.
  double efficiency(double size) const;
  double peak(const std::string& dtype) const;  // throws naming the dtype and the file
};

// Reads a cluster file; throws smp::Error naming the file and the key.
Cluster read_cluster(const std::string& path);
// A shipped preset by name (configs/clusters/<name>.toml, searched beside the
// source tree and the install), or a path.
Cluster load_cluster(const std::string& name_or_path);

}  // namespace smp::plan
