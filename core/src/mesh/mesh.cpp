// DeviceMesh: rank <-> coordinates on named dimensions, and the groups along
// every axis. Each axis is a list of digits of the dimensions' coordinates, so
// splits (ep, edp) and joins (flattened axes, mp, world) share one code path.
#include <smp/error.h>
#include <smp/mesh.h>

#include "base/axis_names.h"

#include <algorithm>
#include <cctype>

namespace smp {

namespace {

static_assert(Axis::kMaxName == kMaxAxisName, "one limit on axis names");

std::string join(const std::vector<std::string>& parts, const char* sep = ",") {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

std::vector<std::string> split_order(const std::string& order) {
  if (order == "cluster") return {"pp", "dp", "tp"};
  if (order == "spread") return {"pp", "tp", "dp"};
  std::string compact = order;  // spaces anywhere are allowed here
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  compact.erase(std::remove_if(compact.begin(), compact.end(), space), compact.end());
  const std::vector<std::string> parts = split_names(compact);
  std::vector<std::string> sorted = parts;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != std::vector<std::string>{"dp", "pp", "tp"})
    throw Error("device mesh: invalid order \"" + order +
                "\": expected a permutation of pp,dp,tp (slowest- to fastest-varying), or cluster/spread");
  return parts;
}

}  // namespace

Axis::Axis(const std::string& name) : name_{} {
  if (!is_axis_name(name))
    throw Error("device mesh: invalid axis name \"" + name + "\" (lower-case letters, digits and '_', "
                "starting with a letter, at most " + std::to_string(kMaxName) + " characters)");
  std::copy(name.begin(), name.end(), name_);
}

Axis axis_from_name(const std::string& name) {
  if (builtin_axis(name)) return Axis(name);
  std::vector<std::string> known;
  for (const auto& a : builtin_axes()) known.push_back(a.name);
  throw Error("device mesh: no axis named \"" + name + "\" (known: " + join(known, ", ") + ")");
}

DeviceMesh::DeviceMesh(const MeshSpec& spec, int rank) : world_(spec.world_size()), rank_(rank), spec_(spec) {
  build();
}

namespace {

// The spec of a mesh given by names: "pp" and "dp" have their roles, the
// sequence ones Sequence, any other Model. The product is checked against the
// world here, with the caller's names.
MeshSpec spec_of(int world, const std::vector<int>& shape, const std::vector<std::string>& names,
                 const MeshOptions& options) {
  if (shape.size() != names.size())
    throw Error("device mesh: " + std::to_string(shape.size()) + " sizes for " + std::to_string(names.size()) +
                " dimensions (" + join(names) + ")");
  std::vector<MeshDim> dims;
  long long product = 1;
  std::string sizes;
  for (size_t i = 0; i < names.size(); ++i) {
    const Axis named(names[i]);  // validates the name
    const BuiltinAxis* b = builtin_axis(names[i]);
    const bool fixed = b && (b->role == Role::Pipeline || b->role == Role::Batch);
    const bool sequence = std::find(options.sequence.begin(), options.sequence.end(), names[i]) != options.sequence.end();
    dims.push_back({names[i], shape[i], fixed ? b->role : sequence ? Role::Sequence : Role::Model});
    if (b && !is_dimension(b->role)) dims.back().role = b->role;  // refused by MeshSpec, by name
    product *= shape[i];
    sizes += (sizes.empty() ? "" : "*") + std::to_string(shape[i]);
  }
  for (const auto& n : options.sequence) {
    const BuiltinAxis* b = builtin_axis(n);
    if (std::find(names.begin(), names.end(), n) == names.end() || (b && b->role != Role::Sequence && b->role != Role::Model) ||
        n == "tp")
      throw Error("device mesh: the sequence axis \"" + n + "\" must be one of the job's own dimensions (" +
                  join(names, ", ") + ")");
  }
  MeshSpec spec(dims, options.ep, options.flatten);  // names, sizes, roles, ep and joins
  if (product != world)
    throw Error("device mesh: " + join(names, "*") + " = " + sizes + " = " + std::to_string(product) +
                " does not equal the world size " + std::to_string(world));
  return spec;
}

}  // namespace

DeviceMesh::DeviceMesh(int world_size, int rank, const std::vector<int>& shape, const std::vector<std::string>& names,
                       const MeshOptions& options)
    : world_(world_size), rank_(rank), spec_(spec_of(world_size, shape, names, options)) {
  build();
  order_ = join(names);  // as given: the spec adds pp, dp and tp where missing
}

DeviceMesh::DeviceMesh(int world_size, int rank, int pp, int dp, int tp, const std::string& order, int ep)
    : world_(world_size), rank_(rank) {
  if (pp < 1 || dp < 1 || tp < 1)
    throw Error("device mesh: degrees must be >= 1, got pp=" + std::to_string(pp) + " dp=" + std::to_string(dp) +
                " tp=" + std::to_string(tp));
  if (static_cast<long long>(pp) * dp * tp != world_size)
    throw Error("device mesh: pp*dp*tp = " + std::to_string(pp) + "*" + std::to_string(dp) + "*" +
                std::to_string(tp) + " = " + std::to_string(static_cast<long long>(pp) * dp * tp) +
                " does not equal the world size " + std::to_string(world_size));
  const auto names = split_order(order);
  std::vector<int> shape;
  for (const auto& n : names) shape.push_back(n == "pp" ? pp : n == "dp" ? dp : tp);
  MeshOptions options;
  options.ep = ep;
  spec_ = spec_of(world_size, shape, names, options);
  build();
}

void DeviceMesh::build() {
  if (spec_.dims().empty()) spec_ = MeshSpec(std::vector<MeshDim>{});  // a default MeshSpec: the one-rank mesh
  if (rank_ < 0 || rank_ >= world_)
    throw Error("device mesh: rank " + std::to_string(rank_) + " is outside [0, " + std::to_string(world_) + ")");
  // Dimensions in their canonical order (the spec's pp, dp, tp first, then the
  // others in rank order); strides from the rank order.
  const std::vector<MeshDim>& dims = spec_.dims();
  std::vector<std::string> layout;
  for (const auto& d : dims) layout.push_back(d.name);
  order_ = join(layout);
  dim_names_ = {"pp", "dp", "tp"};
  for (const auto& d : dims)
    if (std::find(dim_names_.begin(), dim_names_.end(), d.name) == dim_names_.end()) dim_names_.push_back(d.name);
  const auto dim_index = [&](const std::string& n) {
    return static_cast<int>(std::find(dim_names_.begin(), dim_names_.end(), n) - dim_names_.begin());
  };
  dim_size_.assign(dim_names_.size(), 1);
  dim_stride_.assign(dim_names_.size(), 1);
  dim_role_.assign(dim_names_.size(), Role::Model);
  for (const auto& d : dims) {
    dim_size_[dim_index(d.name)] = d.size;
    dim_role_[dim_index(d.name)] = d.role;
  }
  int stride = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    const int d = dim_index(dims[i].name);
    dim_stride_[d] = stride;
    stride *= dim_size_[d];
  }

  // Factors: the Batch dimension splits into (ExpertBatch, Expert) when 1 < ep
  // < its size; every other dimension is one digit.
  const int batch = dim_index(spec_.names_with(Role::Batch).front());
  const int dp = dim_size_[batch], ep = spec_.ep();
  std::vector<std::vector<int>> of_dim(dim_names_.size());
  for (int d = 0; d < static_cast<int>(dim_names_.size()); ++d) {
    if (d == batch && ep > 1 && ep < dp) {
      of_dim[d] = {static_cast<int>(factors_.size()), static_cast<int>(factors_.size()) + 1};
      factors_.push_back({d, ep, dp / ep});
      factors_.push_back({d, 1, ep});
    } else {
      of_dim[d] = {static_cast<int>(factors_.size())};
      factors_.push_back({d, 1, dim_size_[d]});
    }
  }
  for (int d = 0; d < static_cast<int>(dim_names_.size()); ++d)
    defs_.push_back({Axis(dim_names_[d]), dim_role_[d], of_dim[d]});
  const bool split = of_dim[batch].size() == 2;
  for (const MeshDerived& x : spec_.derived()) {
    std::vector<int> factors;
    if (x.role == Role::Expert)
      factors = split ? std::vector<int>{of_dim[batch][1]} : ep == dp ? of_dim[batch] : std::vector<int>{};
    else if (x.role == Role::ExpertBatch)
      factors = split ? std::vector<int>{of_dim[batch][0]} : ep == 1 ? of_dim[batch] : std::vector<int>{};
    else
      for (const auto& p : x.parts) factors.insert(factors.end(), of_dim[dim_index(p)].begin(), of_dim[dim_index(p)].end());
    defs_.push_back({Axis(x.name), x.role, factors});
  }
  for (const auto& a : defs_) axis_list_.push_back(a.axis);
}

namespace {

[[noreturn]] void no_such_axis(const std::string& name, const std::vector<Axis>& axes) {
  std::string known;
  for (const auto& a : axes) known += std::string(known.empty() ? "" : ", ") + a.name();
  throw Error("device mesh: no axis named \"" + name + "\" (this job's mesh has: " + known + ")");
}

}  // namespace

const DeviceMesh::AxisDef& DeviceMesh::def(const Axis& axis) const {
  for (const auto& a : defs_)
    if (a.axis == axis) return a;
  no_such_axis(axis.name(), axis_list_);
}

bool DeviceMesh::has(const Axis& axis) const {
  return std::any_of(defs_.begin(), defs_.end(), [&](const AxisDef& a) { return a.axis == axis; });
}

Axis DeviceMesh::axis(const std::string& name) const {
  for (const auto& a : defs_)
    if (name == a.axis.name()) return a.axis;
  no_such_axis(name, axis_list_);
}

std::vector<Axis> DeviceMesh::axes_with(Role role) const {
  std::vector<Axis> out;
  for (const auto& a : defs_)
    if (a.role == role) out.push_back(a.axis);
  return out;
}

Axis DeviceMesh::axis_with(Role role) const {
  const std::vector<Axis> found = axes_with(role);
  if (found.size() != 1)
    throw Error(std::string("device mesh: ") + std::to_string(found.size()) + " axes have the role " +
                to_string(role) + " (mesh " + order_ + "): ask for all of them (DeviceMesh::axes_with)");
  return found.front();
}

Role DeviceMesh::role_of(const Axis& axis) const { return def(axis).role; }

std::vector<Axis> DeviceMesh::model_axes() const { return axes_with(Role::Model); }

std::vector<Axis> DeviceMesh::sequence_axes() const { return axes_with(Role::Sequence); }

std::vector<Axis> DeviceMesh::rule_axes() const {
  std::vector<Axis> out = model_axes();
  for (const Axis& a : sequence_axes()) out.push_back(a);
  out.push_back(axis_with(Role::Expert));
  return out;
}

AxisRole DeviceMesh::role(const Axis& axis) const {
  if (!has(axis)) return AxisRole::Derived;
  switch (role_of(axis)) {
    case Role::Batch: return AxisRole::SplitsBatch;
    case Role::Sequence: return AxisRole::SplitsSequence;
    case Role::Pipeline:
    case Role::Model: return AxisRole::SplitsModel;
    default: return AxisRole::Derived;
  }
}

bool DeviceMesh::is_data_axis(const Axis& axis) const {
  const AxisDef& a = def(axis);
  if (a.role == Role::Expert || a.role == Role::ExpertBatch) return true;  // splits of the batch axis, of any size
  return std::any_of(a.factors.begin(), a.factors.end(), [&](int i) { return dim_role_[factors_[i].dim] == Role::Batch; });
}

int DeviceMesh::size(const Axis& axis) const {
  int n = 1;
  for (int f : def(axis).factors) n *= factors_[f].size;
  return n;
}

int DeviceMesh::digit(int r, const Factor& f) const {
  return (r / dim_stride_[f.dim]) % dim_size_[f.dim] / f.div % f.size;
}

int DeviceMesh::coord_of(int r, const Axis& axis) const {
  if (r < 0 || r >= world_)
    throw Error("device mesh: rank " + std::to_string(r) + " is outside [0, " + std::to_string(world_) + ")");
  int c = 0;
  for (int f : def(axis).factors) c = c * factors_[f].size + digit(r, factors_[f]);
  return c;
}

bool DeviceMesh::at_model_origin() const {
  for (size_t d = 0; d < dim_names_.size(); ++d)
    if (dim_role_[d] == Role::Model && (rank_ / dim_stride_[d]) % dim_size_[d] != 0) return false;
  return true;
}

int DeviceMesh::rank_of(int pp_i, int dp_i, int tp_i) const {
  if (pp_i < 0 || pp_i >= pp() || dp_i < 0 || dp_i >= dp() || tp_i < 0 || tp_i >= tp())
    throw Error("device mesh: coordinates (pp=" + std::to_string(pp_i) + ", dp=" + std::to_string(dp_i) +
                ", tp=" + std::to_string(tp_i) + ") are outside the mesh pp=" + std::to_string(pp()) +
                " dp=" + std::to_string(dp()) + " tp=" + std::to_string(tp()));
  return pp_i * dim_stride_[0] + dp_i * dim_stride_[1] + tp_i * dim_stride_[2];
}

std::vector<int> DeviceMesh::group_of(int r, const Axis& axis) const {
  const auto& fs = def(axis).factors;
  const int n = size(axis);
  if (r < 0 || r >= world_)
    throw Error("device mesh: rank " + std::to_string(r) + " is outside [0, " + std::to_string(world_) + ")");
  std::vector<int> g;
  g.reserve(n);
  for (int k = 0; k < n; ++k) {
    // r with the axis' digits replaced by those of k (the last digit least significant).
    int rank = r, rest = k;
    for (size_t i = fs.size(); i-- > 0;) {
      const Factor& f = factors_[fs[i]];
      const int want = rest % f.size;
      rest /= f.size;
      rank += (want - digit(r, f)) * f.div * dim_stride_[f.dim];
    }
    g.push_back(rank);
  }
  return g;
}

int DeviceMesh::index_of(int r, const Axis& axis) const {
  const auto& fs = def(axis).factors;
  int index = 0;
  for (int i = 0; i < static_cast<int>(factors_.size()); ++i)
    if (std::find(fs.begin(), fs.end(), i) == fs.end()) index = index * factors_[i].size + digit(r, factors_[i]);
  return index;
}

std::string DeviceMesh::group_name(const Axis& axis) const {
  return std::string(axis.name()) + "." + std::to_string(group_index(axis));
}

std::vector<std::vector<int>> DeviceMesh::all_groups(const Axis& axis) const {
  const int n = world_ / size(axis);
  std::vector<std::vector<int>> groups(n);
  for (int r = 0; r < world_; ++r) {
    auto& g = groups[index_of(r, axis)];
    if (g.empty()) g = group_of(r, axis);
  }
  return groups;
}

}  // namespace smp
