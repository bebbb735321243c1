// Where a parameter lives on one mesh axis, DTensor's placements: replicated,
// sharded along a tensor dimension, or replicated with a partial value (its
// gradient a partial sum over the axis). A parameter lists one per axis it can
// differ on (ParameterView::placements); the checkpoint manifest records them
// by axis name and role. Pure C++: std only.
#pragma once

#include <smp/axis_role.h>

#include <string>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

enum class PlacementKind { Replicate, Shard, Partial };

struct AxisPlacement {
  std::string axis;  // the mesh axis' name ("tp", "ep", a job's axis)
  Role role = Role::Model;
  PlacementKind kind = PlacementKind::Replicate;
  int dim = -1;  // Shard: the tensor dimension split over the axis' ranks, in rank order

  bool sharded() const { return kind == PlacementKind::Shard; }
  friend bool operator==(const AxisPlacement& a, const AxisPlacement& b) {
    return a.axis == b.axis && a.role == b.role && a.kind == b.kind && a.dim == b.dim;
  }
};

// "replicate", "shard(1)", "partial" (the manifest's words; DTensor's Replicate(),
// Shard(1), Partial()).
std::string to_string(const AxisPlacement& placement);
// The inverse, for `axis` with `role`; throws smp::Error for another text.
AxisPlacement placement_from_string(const std::string& text, const std::string& axis, Role role);

}  // namespace smp
#pragma GCC visibility pop
