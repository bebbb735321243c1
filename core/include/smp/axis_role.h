// What a mesh axis does (Role) and the axes the core itself names, each with
// its role: the one list of reserved names. A value type below the mesh (the
// config refuses the reserved names; MeshSpec lays the mesh out by role).
// Pure C++: std only.
#pragma once

#include <string>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

// What an axis does.
//   Dimensions (their sizes multiply to the world):
//     Pipeline  splits the model into stages (pp)
//     Batch     each coordinate reads its own samples (dp)
//     Sequence  each coordinate holds its share of every sample's sequence
//               (parallel.cp's "cp", and the job's parallel.sequence_axes)
//     Model     replicates the batch; the plugins' rules split the model (tp,
//               and the job's other parallel.axes)
//   Derived (made of dimensions' digits):
//     Expert       the Batch ranks split into groups exchanging tokens (ep)
//     ExpertBatch  the Batch ranks holding the same experts (edp)
//     Joined       a join of dimensions (parallel.flatten)
//     Replica      one replica of the model: Pipeline and Model, at one Batch
//                  and Sequence coordinate (mp)
//     World        every rank
enum class Role { Pipeline, Batch, Sequence, Model, Expert, ExpertBatch, Joined, Replica, World };

// "pipeline", "batch", "sequence", "model", "expert", "expert_batch",
// "joined", "replica", "world" (the checkpoint manifest's words).
const char* to_string(Role role);
// The role called `name`; throws smp::Error listing them.
Role role_from_string(const std::string& name);
inline bool is_dimension(Role role) {
  return role == Role::Pipeline || role == Role::Batch || role == Role::Sequence || role == Role::Model;
}

// Whether plugins' rules rewrite the model for an axis of this role, and
// whether a parameter may be placed on one (Replicate/Shard/Partial).
inline bool rules_apply(Role role) { return role == Role::Model || role == Role::Sequence || role == Role::Expert; }
inline bool placeable(Role role) { return rules_apply(role) || role == Role::Batch; }

// An axis the core itself names, with its role: the one list of reserved
// names (a job may not declare them; plugins meet them only through roles).
struct BuiltinAxis {
  const char* name;
  Role role;
  bool in_every_mesh;  // a dimension of every mesh (size 1 where the job does not split): pp, dp, tp
};
const std::vector<BuiltinAxis>& builtin_axes();
// The built-in axis called `name`, or nullptr.
const BuiltinAxis* builtin_axis(const std::string& name);

}  // namespace smp
#pragma GCC visibility pop
