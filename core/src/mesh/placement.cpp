#include "mesh/placement.h"

#include <smp/error.h>

#include <algorithm>

namespace smp {

namespace {

// The axes a plugin may place a parameter on: where rules apply, and the Batch axis.
std::vector<std::string> placeable_axes(const DeviceMesh* mesh) {
  std::vector<std::string> out;
  if (!mesh) return out;
  for (const Axis& a : mesh->rule_axes()) out.push_back(a.name());
  out.push_back(mesh->axis_with(Role::Batch).name());
  return out;
}

// An axis' role: the mesh's; with no mesh, a built-in name's, else Model (a job's axis).
Role role_in(const DeviceMesh* mesh, const Axis& axis) {
  if (mesh && mesh->has(axis)) return mesh->role_of(axis);
  const BuiltinAxis* b = builtin_axis(axis.name());
  return b ? b->role : Role::Model;
}

// The built-in axis with `role` (Batch, ExpertBatch: one each).
Axis builtin_with(Role role) {
  for (const BuiltinAxis& b : builtin_axes())
    if (b.role == role) return Axis(b.name);
  throw Error("internal: no built-in axis has the role " + std::string(to_string(role)));
}

std::string quoted(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

}  // namespace

Placements Placements::checked(const std::vector<DeclaredPlacement>& declared, int64_t ndim,
                               const std::string& where, const DeviceMesh* mesh) {
  Placements out;
  const std::vector<std::string> allowed = placeable_axes(mesh);
  for (const DeclaredPlacement& s : declared) {
    const std::string& axis = s.axis;
    Placement pl;
    const BuiltinAxis* builtin = builtin_axis(axis);
    const bool core_only = builtin && !placeable(builtin->role);
    if (mesh ? std::find(allowed.begin(), allowed.end(), axis) == allowed.end() : core_only)
      throw Error(where + ": placement on axis '" + axis + "': parameters are placed on " +
                  (mesh ? quoted(allowed) : std::string("the mesh's model axes, \"ep\" or \"dp\"")));
    try {
      pl.axis = Axis(axis);
    } catch (const Error& e) {
      throw Error(where + ": " + e.what());
    }
    for (const auto& q : out.list_)
      if (q.axis == pl.axis) throw Error(where + ": two placements on axis '" + axis + "'");
    const Role role = role_in(mesh, pl.axis);
    const bool data = mesh ? mesh->is_data_axis(pl.axis) : (role == Role::Batch || role == Role::Expert);
    pl.kind = s.kind;
    switch (s.kind) {
      case PlacementKind::Replicate: break;
      case PlacementKind::Partial:
        // The data-parallel reduction already sums over this axis: a partial sum there would be added twice.
        if (data)
          throw Error(where + ": a partial gradient on axis \"" + axis + "\" is refused: data parallelism already "
                      "sums gradients over \"" + axis + "\" (declare it replicated there)");
        break;
      case PlacementKind::Shard:
        if (s.dim < 0 || s.dim >= ndim)
          throw Error(where + ": shard dimension " + std::to_string(s.dim) + " on axis '" + axis +
                      "' is outside a " + std::to_string(ndim) + "-dimensional parameter");
        if (data && role != Role::Expert)
          throw Error(where + ": sharding a parameter over \"" + axis +
                      "\" is the memory manager's (ZeRO), not a plugin's");
        pl.dim = s.dim;
        break;
    }
    if (pl.kind != PlacementKind::Replicate) out.list_.push_back(pl);
  }
  return out;
}

PlacementKind Placements::kind(Axis axis) const {
  for (const auto& p : list_)
    if (p.axis == axis) return p.kind;
  return PlacementKind::Replicate;
}

int Placements::shard_dim(Axis axis) const {
  for (const auto& p : list_)
    if (p.axis == axis && p.kind == PlacementKind::Shard) return p.dim;
  return -1;
}

Placements Placements::with_partial_grad(Axis axis) const {
  Placements out = *this;
  out.list_.push_back({axis, PlacementKind::Partial, -1});
  return out;
}

Placements Placements::sharded_over_data() const {
  Placements out = *this;
  out.list_.push_back({data_parallel_axis(), PlacementKind::Shard, 0});
  return out;
}

Axis Placements::data_parallel_axis() const {
  for (const auto& p : list_)
    if (p.kind == PlacementKind::Shard && role_in(nullptr, p.axis) == Role::Expert) return builtin_with(Role::ExpertBatch);
  return builtin_with(Role::Batch);
}

std::vector<AxisPlacement> Placements::per_axis(const DeviceMesh& mesh) const {
  std::vector<AxisPlacement> out;
  for (const Axis& a : mesh.axes()) {
    const Role role = mesh.role_of(a);
    if (!placeable(role)) continue;
    AxisPlacement p;
    p.axis = a.name();
    p.role = role;
    p.kind = kind(a);
    p.dim = shard_dim(a);
    out.push_back(p);
  }
  return out;
}

bool Placements::counted_on(const DeviceMesh& mesh, int data_coord) const {
  for (const Axis& a : mesh.model_axes())
    if (!sharded(a) && mesh.coord(a) != 0) return false;
  for (const Axis& a : mesh.sequence_axes())
    if (!sharded(a) && mesh.coord(a) != 0) return false;
  // The data axis: experts differ across ep, and are the same across edp.
  const Axis data = data_parallel_axis();
  return sharded(data) || mesh.coord(data) == data_coord;
}

}  // namespace smp
