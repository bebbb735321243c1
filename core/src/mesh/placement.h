// Where a parameter lives on each mesh axis (DTensor's placements, kept small):
// replicated, sharded along a dimension, or replicated with a partial gradient
// that must be summed over the axis. Gradient reduction, the global gradient
// norm, clipping (and later ZeRO and checkpoint resharding) are derived from
// these alone.
#pragma once

#include <smp/axis_placement.h>
#include <smp/mesh.h>

#include <string>
#include <vector>

namespace smp {

struct Placement {
  Axis axis = Axis::TP;
  PlacementKind kind = PlacementKind::Replicate;
  int dim = -1;  // Shard only
};

// A placement as a plugin declares it, before it is checked: the axis by name.
struct DeclaredPlacement {
  std::string axis;
  PlacementKind kind = PlacementKind::Replicate;
  int dim = -1;
};

// A parameter's placements; an axis that is not listed is replicated.
class Placements {
 public:
  Placements() = default;
  // What a module declared (plugin/placement_abi.h reads it from the ABI).
  // Throws smp::Error (prefixed with `where`) for an axis that parameters
  // cannot be placed on (the mesh's rule axes, and dp replicated; with no mesh,
  // any valid name but pp, edp, mp and world), a partial gradient or a shard on
  // a data axis (but experts on ep), a duplicate axis or a shard dimension
  // outside [0, ndim).
  static Placements checked(const std::vector<DeclaredPlacement>& declared, int64_t ndim, const std::string& where,
                            const DeviceMesh* mesh = nullptr);

  PlacementKind kind(Axis axis) const;
  bool sharded(Axis axis) const { return kind(axis) == PlacementKind::Shard; }
  bool partial_grad(Axis axis) const { return kind(axis) == PlacementKind::Partial; }
  int shard_dim(Axis axis) const;  // -1 unless sharded on axis
  const std::vector<Placement>& list() const { return list_; }

  // The data-parallel group a gradient is averaged over: the Batch axis (dp),
  // or for a parameter sharded over the Expert axis (an expert), the
  // ExpertBatch one (edp).
  Axis data_parallel_axis() const;

  // The same with a partial gradient on `axis` (replicated there before).
  Placements with_partial_grad(Axis axis) const;

  // The same parameter sharded over its data-parallel axis too (ZeRO: each
  // rank owns a flat shard of its gradient bucket).
  Placements sharded_over_data() const;

  // Whether this rank holds a distinct value of the parameter that no other
  // rank counts: on every model and sequence axis where it is not sharded, only coordinate 0
  // counts, but on the data-parallel axis coordinate `data_coord` (so that
  // the replicas' share of a sum over the world can be spread over the data
  // ranks). Used so a sum over the world counts each value once.
  bool counted_on(const DeviceMesh& mesh, int data_coord = 0) const;

  // The public form: one placement per axis of `mesh` a parameter may be
  // placed on (placeable roles: Model, Sequence, Batch dimensions and the
  // Expert axis), in the mesh's axis order, Replicate where not listed.
  std::vector<AxisPlacement> per_axis(const DeviceMesh& mesh) const;

 private:
  std::vector<Placement> list_;
};

}  // namespace smp
