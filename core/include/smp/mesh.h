// The device mesh: world ranks laid out as a grid of named dimensions (PyTorch's
// DeviceMesh), with derived axes that split or flatten them. Pure C++.
//
// It is laid out from a MeshSpec (mesh_spec.h): every axis has a Role, and the
// core decides from roles, never from names. Batch (dp) splits the batch (each
// coordinate reads its own share); Sequence (parallel.cp's "cp", the job's
// parallel.sequence_axes) splits every sample's sequence; Pipeline (pp) and
// Model (tp and the job's other axes, which the core knows by name only) split
// the model: they replicate the batch and split what their plugins' rules
// split. Derived axes: Expert (ep) splits the Batch ranks of a slice into
// groups of ep consecutive Batch indices (the ranks that exchange tokens in an
// expert layer); ExpertBatch (edp) the Batch ranks holding the same experts
// (Batch index = e + k*ep for fixed e); Joined axes join dimensions
// (torchtitan's dp_shard_cp); Replica (mp) joins Pipeline and every Model axis
// at one Batch index (one replica of the model, without the Sequence axes);
// World every rank.
#pragma once

#include <smp/mesh_spec.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

// A mesh axis, by name ([a-z][a-z0-9_]*, at most 15 characters). The core's
// own axes have constants (MeshSpec's built-in names, for tests and tools);
// the core itself finds an axis by its role (DeviceMesh::axis_with).
class Axis {
 public:
  static constexpr std::size_t kMaxName = 15;
  constexpr Axis() : name_{} {}
  // Throws smp::Error for a name that is not a valid axis name.
  explicit Axis(const std::string& name);
  static const Axis PP, DP, TP, EP, EDP, MP, World;

  const char* name() const { return name_; }
  friend bool operator==(const Axis& a, const Axis& b) { return compare(a, b) == 0; }
  friend bool operator!=(const Axis& a, const Axis& b) { return compare(a, b) != 0; }
  friend bool operator<(const Axis& a, const Axis& b) { return compare(a, b) < 0; }

 private:
  struct Literal {};
  template <std::size_t N>
  constexpr Axis(const char (&s)[N], Literal) : name_{} {
    static_assert(N <= kMaxName + 1, "axis name too long");
    for (std::size_t i = 0; i < N; ++i) name_[i] = s[i];
  }
  static int compare(const Axis& a, const Axis& b) {
    for (std::size_t i = 0; i <= kMaxName; ++i)
      if (a.name_[i] != b.name_[i] || !a.name_[i]) return a.name_[i] - b.name_[i];
    return 0;
  }
  char name_[kMaxName + 1];
};
inline constexpr Axis Axis::PP{"pp", Axis::Literal{}};
inline constexpr Axis Axis::DP{"dp", Axis::Literal{}};
inline constexpr Axis Axis::TP{"tp", Axis::Literal{}};
inline constexpr Axis Axis::EP{"ep", Axis::Literal{}};
inline constexpr Axis Axis::EDP{"edp", Axis::Literal{}};
inline constexpr Axis Axis::MP{"mp", Axis::Literal{}};
inline constexpr Axis Axis::World{"world", Axis::Literal{}};

inline const char* axis_name(const Axis& axis) { return axis.name(); }
// One of the core's own axes by name; throws smp::Error listing them. A job's
// mesh knows more: DeviceMesh::axis.
Axis axis_from_name(const std::string& name);

// What a dimension does to the data (Role, coarser: Pipeline is SplitsModel,
// the derived roles Derived). The core decides from these, never from names: what
// feeds the batch (SplitsBatch), where a loss or gradient is a partial sum
// (SplitsBatch and SplitsSequence), where a value is counted once
// (SplitsModel: coordinate 0), where rules apply (SplitsModel and
// SplitsSequence, not pp).
enum class AxisRole {
  SplitsBatch,     // dp: each coordinate reads its own samples
  SplitsSequence,  // parallel.cp: each coordinate holds its share of every sample's sequence
  SplitsModel,     // pp, tp and the job's axes: the batch is replicated, rules split the model
  Derived          // not a dimension (ep, edp, a join, mp, world)
};

// What a mesh has beyond its dimensions.
struct MeshOptions {
  int ep = 1;  // expert parallelism: must divide dp
  // The job's dimensions that split each sample's sequence (SplitsSequence);
  // every other job dimension splits the model.
  std::vector<std::string> sequence;
  // Derived axes joining dimensions, e.g. {"dp_cp", {"dp", "cp"}} (first slowest).
  std::vector<std::pair<std::string, std::vector<std::string>>> flatten;
};

class DeviceMesh {
 public:
  // The mesh `spec` describes, seen from `rank`. Throws smp::Error for a rank
  // outside [0, spec.world_size()).
  DeviceMesh(const MeshSpec& spec, int rank);
  // names: the dimensions from slowest- to fastest-varying rank index, shape
  // their sizes (their product is the world size). "pp" is the Pipeline
  // dimension, "dp" the Batch one, options.sequence the Sequence ones, every
  // other one a Model one; "pp", "dp" and "tp" are dimensions of size 1 when
  // not named. Throws smp::Error naming the values for a bad size, name,
  // product, rank, ep or flattened axis.
  DeviceMesh(int world_size, int rank, const std::vector<int>& shape, const std::vector<std::string>& names,
             const MeshOptions& options = {});
  // The pp x dp x tp grid. order: a permutation of "pp,dp,tp" (spaces allowed),
  // slowest first; "cluster" = "pp,dp,tp", "spread" = "pp,tp,dp".
  DeviceMesh(int world_size, int rank, int pp, int dp, int tp, const std::string& order = "pp,dp,tp", int ep = 1);

  int world_size() const { return world_; }
  int rank() const { return rank_; }
  int pp() const { return size(Axis::PP); }
  int dp() const { return size(Axis::DP); }
  int tp() const { return size(Axis::TP); }
  int ep() const { return size(Axis::EP); }
  // The dimensions' names, slowest first, joined by commas ("pp,dp,cp,tp").
  const std::string& order() const { return order_; }
  // What this mesh was laid out from.
  const MeshSpec& spec() const { return spec_; }

  // Every axis: the dimensions (pp, dp, tp, then the job's in order), then the
  // derived ones (ep, edp, flattened, mp, world).
  const std::vector<Axis>& axes() const { return axis_list_; }
  bool has(const Axis& axis) const;
  // The axis called `name`; throws smp::Error listing this mesh's axes.
  Axis axis(const std::string& name) const;
  // The model axes: tp and the job's own dimensions that split the model (each
  // replicates the batch).
  std::vector<Axis> model_axes() const;
  // The job's dimensions that split each sample's sequence.
  std::vector<Axis> sequence_axes() const;
  // The axes rules apply on, in the order they are applied: the model axes,
  // the sequence axes, then ep.
  std::vector<Axis> rule_axes() const;
  AxisRole role(const Axis& axis) const;
  // The axis' Role (throws for an axis this mesh does not have).
  Role role_of(const Axis& axis) const;
  // The one axis with `role` (Pipeline, Batch, Expert, ExpertBatch, Replica,
  // World: every mesh has exactly one); throws smp::Error when there is not
  // exactly one (Model, Sequence, Joined: ask axes_with).
  Axis axis_with(Role role) const;
  // The axes with `role`: dimensions in dimension order, then derived ones.
  std::vector<Axis> axes_with(Role role) const;
  // Size of, and this rank's coordinate on, the one axis with `role`.
  int size(Role role) const { return size(axis_with(role)); }
  int coord(Role role) const { return coord(axis_with(role)); }
  // Whether a gradient is already summed over `axis` by data parallelism:
  // dp, ep, edp, or a flattened axis over dp.
  bool is_data_axis(const Axis& axis) const;

  int size(const Axis& axis) const;  // group size along an axis
  // This rank's position on an axis (its index in group(axis)); World: the rank.
  int coord(const Axis& axis) const { return coord_of(rank_, axis); }
  int coord_of(int rank, const Axis& axis) const;
  // Whether this rank is at coordinate 0 of every model axis (where a value
  // replicated over them is counted once; a sequence axis holds partial sums).
  bool at_model_origin() const;
  // The rank at (pp_i, dp_i, tp_i), coordinate 0 on the other dimensions.
  int rank_of(int pp_i, int dp_i, int tp_i) const;

  // The world ranks of this rank's group along `axis`, in axis order (group rank
  // i = element i). MP: pp-major. World: 0..world-1.
  std::vector<int> group(const Axis& axis) const { return group_of(rank_, axis); }
  std::vector<int> group_of(int rank, const Axis& axis) const;
  // Every group along `axis` (a partition of the world), in group-index order.
  std::vector<std::vector<int>> all_groups(const Axis& axis) const;
  // Index of this rank's group in all_groups(axis): the coordinates that stay
  // fixed along the axis, in dimension order (pp, dp, tp, the job's). And a
  // job-unique name for the group, e.g. "tp.3".
  int group_index(const Axis& axis) const { return index_of(rank_, axis); }
  std::string group_name(const Axis& axis) const;

 private:
  // A digit of one dimension's coordinate: (coordinate / div) % size.
  struct Factor {
    int dim, div, size;
  };
  struct AxisDef {
    Axis axis;
    Role role;
    std::vector<int> factors;  // into factors_, most significant first
  };
  void build();
  const AxisDef& def(const Axis& axis) const;
  int digit(int rank, const Factor& f) const;
  int index_of(int rank, const Axis& axis) const;

  int world_, rank_;
  MeshSpec spec_;
  std::string order_;
  std::vector<std::string> dim_names_;  // pp, dp, tp, then the job's dimensions
  std::vector<int> dim_size_, dim_stride_;
  std::vector<Role> dim_role_;     // by dimension
  std::vector<Factor> factors_;  // by dimension, most significant first
  std::vector<AxisDef> defs_;
  std::vector<Axis> axis_list_;
};

}  // namespace smp
#pragma GCC visibility pop
