// Replicas start identical: every parameter replicated over a data-parallel
// axis (dp, or edp for an expert) must hold the same values on each of that
// axis' ranks before the first step, whatever its module kind (a plugin's, or
// a program's own torch::nn::Module) did at creation. Checked, not repaired:
// a difference is a bug in how the model is made (an unseeded or
// rank-dependent initialisation), and training on would silently diverge.
#pragma once

#include <smp/mesh.h>

#include "mesh/placement.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace smp {

class Communicator;

struct ReplicaCandidate {
  std::string name;  // the parameter's full name, for the message
  at::Tensor tensor;
  Axis data_axis;  // where it is replicated (Placements::data_parallel_axis)
};

// A 64-bit fingerprint of a tensor's bytes (its dtype and shape included).
uint64_t fingerprint(const at::Tensor& t);

// Compares the fingerprints of `params` over each data axis larger than one
// (`comm_of` gives its communicator) and throws smp::Error naming the first
// parameter whose replicas differ, the axis and the world ranks involved, on
// every rank of that axis alike. `origin` prefixes the message.
void check_replicas_agree(const std::vector<ReplicaCandidate>& params, const DeviceMesh& mesh,
                          const std::function<Communicator&(Axis)>& comm_of, const std::string& origin);

}  // namespace smp
