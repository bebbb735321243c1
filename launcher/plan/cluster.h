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
  std::map<std::string, double> peak_flops;    // by dtype ("fp16", "bf16", "fp32")
  std::vector<std::pair<double, double>> gemm_efficiency;  // (smallest GEMM dimension, fraction of peak), rising sizes
  int node_size = 1;                           // accelerators per node
  Link intra, inter;
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
