// The mesh described once (torchtitan's ParallelDims): each dimension's name,
// size and role, and the derived axes with the dimensions they are made of.
// MeshSpec::from builds it from the job's parallel.* keys, in one place; the
// DeviceMesh is laid out from it, and every decision elsewhere asks a role
// (DeviceMesh::axis_with, axes_with), never an axis name. Pure C++: std only.
#pragma once

#include <smp/axis_role.h>

#include <string>
#include <utility>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

struct ParallelConfig;

struct MeshDim {
  std::string name;
  int size = 1;
  Role role = Role::Model;
};

struct MeshDerived {
  std::string name;
  Role role = Role::Joined;
  std::vector<std::string> parts;  // the dimensions it is made of, slowest first (Expert, ExpertBatch: the Batch one)
};

class MeshSpec {
 public:
  MeshSpec() = default;
  // dims: in rank order, slowest- to fastest-varying; exactly one Pipeline and
  // one Batch dimension and the built-in Model one (tp) are added, of size 1,
  // where missing (outermost). ep: the Expert axis' size (must divide the Batch
  // size). joins: Joined axes {name, dimensions}. Throws smp::Error naming the
  // values for a bad name, size, role, ep or join.
  MeshSpec(std::vector<MeshDim> dims, int ep = 1,
           const std::vector<std::pair<std::string, std::vector<std::string>>>& joins = {});
  // The job's mesh: parallel.pp, dp, tp, cp, ep, axes, sequence_axes,
  // placement (the rank order, after Config::resolve_layout) and flatten.
  static MeshSpec from(const ParallelConfig& parallel);

  const std::vector<MeshDim>& dims() const { return dims_; }        // rank order, slowest first
  const std::vector<MeshDerived>& derived() const { return derived_; }  // Expert, ExpertBatch, Joined..., Replica, World
  int world_size() const;
  int ep() const { return ep_; }
  // The dimension called `name`, or nullptr.
  const MeshDim* dim(const std::string& name) const;
  // The dimension or derived axis called `name`: its role; throws when none.
  Role role(const std::string& name) const;
  // The names of the axes (dimensions, then derived) with `role`, in that order.
  std::vector<std::string> names_with(Role role) const;
  // "pp,dp,tp": the dimensions' names in rank order.
  std::string order() const;

 private:
  std::vector<MeshDim> dims_;
  std::vector<MeshDerived> derived_;
  int ep_ = 1;
};

}  // namespace smp
#pragma GCC visibility pop
