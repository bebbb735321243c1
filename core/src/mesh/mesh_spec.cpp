// MeshSpec: the one description of the mesh, and the one place that knows
// which parallel.* key sizes each of the core's own dimensions.
#include <smp/error.h>
#include <smp/job_config.h>
#include <smp/mesh_spec.h>

#include "base/axis_names.h"

#include <algorithm>
#include <iterator>

namespace smp {

namespace {

// The built-in dimensions and the parallel.* key that sizes each ("cp" is a
// dimension when parallel.cp > 1).
struct BuiltinDim {
  const char* name;
  int ParallelConfig::*size;
};
constexpr BuiltinDim kBuiltinDims[] = {
    {"pp", &ParallelConfig::pp}, {"dp", &ParallelConfig::dp}, {"tp", &ParallelConfig::tp}, {"cp", &ParallelConfig::cp}};

std::string join(const std::vector<std::string>& parts, const char* sep = ",") {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

}  // namespace

MeshSpec::MeshSpec(std::vector<MeshDim> dims, int ep,
                   const std::vector<std::pair<std::string, std::vector<std::string>>>& joins)
    : ep_(ep) {
  for (const auto& d : dims) {
    if (!is_axis_name(d.name))
      throw Error("device mesh: invalid axis name \"" + d.name + "\" (lower-case letters, digits and '_', starting "
                  "with a letter, at most " + std::to_string(kMaxAxisName) + " characters)");
    if (d.size < 1) throw Error("device mesh: " + d.name + " = " + std::to_string(d.size) + " must be >= 1");
    const BuiltinAxis* b = builtin_axis(d.name);
    if (b && !is_dimension(b->role)) throw Error("device mesh: \"" + d.name + "\" is a derived axis, not a dimension");
    if (!is_dimension(d.role))
      throw Error("device mesh: \"" + d.name + "\" has the role " + to_string(d.role) + ", which no dimension has");
    // One Pipeline and one Batch dimension, the built-in ones: the derived axes hang off them.
    const bool fixed = b && (b->role == Role::Pipeline || b->role == Role::Batch);
    if ((fixed || d.role == Role::Pipeline || d.role == Role::Batch) && !(b && b->role == d.role))
      throw Error("device mesh: dimension \"" + d.name + "\" cannot have the role " + to_string(d.role) +
                  (b ? std::string(" (it is the ") + to_string(b->role) + " dimension)" : " (pp and dp have it)"));
    for (const auto& e : dims)
      if (&e != &d && e.name == d.name) throw Error("device mesh: dimension \"" + d.name + "\" is named twice");
  }
  for (size_t i = builtin_axes().size(); i-- > 0;) {
    const BuiltinAxis& b = builtin_axes()[i];
    if (b.in_every_mesh && std::none_of(dims.begin(), dims.end(), [&](const MeshDim& d) { return d.name == b.name; }))
      dims.insert(dims.begin(), MeshDim{b.name, 1, b.role});
  }
  dims_ = std::move(dims);
  const int batch = dim("dp")->size;
  if (ep < 1 || batch % ep != 0)
    throw Error("device mesh: ep = " + std::to_string(ep) + " must be >= 1 and divide dp = " + std::to_string(batch) +
                " (expert parallelism splits the data-parallel ranks)");
  derived_.push_back({"ep", Role::Expert, {"dp"}});
  derived_.push_back({"edp", Role::ExpertBatch, {"dp"}});
  for (const auto& [name, parts] : joins) {
    if (builtin_axis(name) || dim(name) ||
        std::any_of(derived_.begin(), derived_.end(), [&](const MeshDerived& x) { return x.name == name; }))
      throw Error("device mesh: flattened axis \"" + name + "\" is already an axis");
    if (!is_axis_name(name)) throw Error("device mesh: invalid axis name \"" + name + "\"");
    if (parts.size() < 2) throw Error("device mesh: flattened axis \"" + name + "\" must join two or more dimensions");
    std::vector<std::string> names;
    for (const auto& d : dims_) names.push_back(d.name);
    for (const auto& p : parts) {
      if (!dim(p))
        throw Error("device mesh: flattened axis \"" + name + "\" joins \"" + p + "\", which is not a dimension (" +
                    join(names, ", ") + ")");
      if (std::count(parts.begin(), parts.end(), p) > 1)
        throw Error("device mesh: flattened axis \"" + name + "\" names \"" + p + "\" twice");
    }
    derived_.push_back({name, Role::Joined, parts});
  }
  // mp: pipeline-major, then the built-in model axis, then the job's model axes in rank order.
  std::vector<std::string> replica = {"pp", "tp"}, world;
  for (const auto& d : dims_) {
    if (d.role == Role::Model && std::find(replica.begin(), replica.end(), d.name) == replica.end())
      replica.push_back(d.name);
    world.push_back(d.name);
  }
  derived_.push_back({"mp", Role::Replica, replica});
  derived_.push_back({"world", Role::World, world});
}

MeshSpec MeshSpec::from(const ParallelConfig& par) {
  std::vector<MeshDim> dims;
  for (const auto& name : split_names(par.placement)) {
    MeshDim d{name, 0, Role::Model};
    for (const auto& b : kBuiltinDims)
      if (name == b.name) d = {name, par.*b.size, builtin_axis(name)->role};
    for (const auto& [axis, size] : par.axes)
      if (axis == name) d.size = size;
    if (std::find(par.sequence_axes.begin(), par.sequence_axes.end(), name) != par.sequence_axes.end())
      d.role = Role::Sequence;
    dims.push_back(d);
  }
  return MeshSpec(std::move(dims), par.ep, par.flatten);
}

int MeshSpec::world_size() const {
  int n = 1;
  for (const auto& d : dims_) n *= d.size;
  return n;
}

const MeshDim* MeshSpec::dim(const std::string& name) const {
  for (const auto& d : dims_)
    if (d.name == name) return &d;
  return nullptr;
}

Role MeshSpec::role(const std::string& name) const {
  if (const MeshDim* d = dim(name)) return d->role;
  for (const auto& d : derived_)
    if (d.name == name) return d.role;
  throw Error("device mesh: no axis named \"" + name + "\" (this mesh: " + order() + " and its derived axes)");
}

std::vector<std::string> MeshSpec::names_with(Role role) const {
  std::vector<std::string> out;
  for (const auto& d : dims_)
    if (d.role == role) out.push_back(d.name);
  for (const auto& d : derived_)
    if (d.role == role) out.push_back(d.name);
  return out;
}

std::string MeshSpec::order() const {
  std::vector<std::string> names;
  for (const auto& d : dims_) names.push_back(d.name);
  return join(names);
}

}  // namespace smp
