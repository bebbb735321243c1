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
  if (is_core_axis(name)) return Axis(name);
  std::vector<std::string> known(std::begin(kCoreAxes), std::end(kCoreAxes));
  throw Error("device mesh: no axis named \"" + name + "\" (known: " + join(known, ", ") + ")");
}

DeviceMesh::DeviceMesh(int world_size, int rank, const std::vector<int>& shape, const std::vector<std::string>& names,
                       const MeshOptions& options)
    : world_(world_size), rank_(rank) {
  build(shape, names, options);
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
  build(shape, names, options);
}

void DeviceMesh::build(const std::vector<int>& shape, const std::vector<std::string>& names,
                       const MeshOptions& options) {
  if (shape.size() != names.size())
    throw Error("device mesh: " + std::to_string(shape.size()) + " sizes for " + std::to_string(names.size()) +
                " dimensions (" + join(names) + ")");
  long long product = 1;
  std::string sizes;
  for (size_t i = 0; i < names.size(); ++i) {
    const Axis named(names[i]);  // validates the name
    if (shape[i] < 1) throw Error("device mesh: " + names[i] + " = " + std::to_string(shape[i]) + " must be >= 1");
    if (std::count(names.begin(), names.end(), names[i]) > 1)
      throw Error("device mesh: dimension \"" + names[i] + "\" is named twice in " + join(names));
    const bool derived = std::find(std::begin(kCoreAxes) + 3, std::end(kCoreAxes), names[i]) != std::end(kCoreAxes);
    if (derived) throw Error("device mesh: \"" + names[i] + "\" is a derived axis, not a dimension");
    product *= shape[i];
    sizes += (sizes.empty() ? "" : "*") + std::to_string(shape[i]);
  }
  if (product != world_)
    throw Error("device mesh: " + join(names, "*") + " = " + sizes + " = " + std::to_string(product) +
                " does not equal the world size " + std::to_string(world_));
  if (rank_ < 0 || rank_ >= world_)
    throw Error("device mesh: rank " + std::to_string(rank_) + " is outside [0, " + std::to_string(world_) + ")");

  // Dimensions in their canonical order (pp, dp, tp, the job's), strides from the rank order.
  std::vector<std::string> layout = names;
  for (const char* core : {"tp", "dp", "pp"})
    if (std::find(layout.begin(), layout.end(), core) == layout.end()) layout.insert(layout.begin(), core);
  dim_names_ = {"pp", "dp", "tp"};
  for (const auto& n : names)
    if (n != "pp" && n != "dp" && n != "tp") dim_names_.push_back(n);
  const auto dim_index = [&](const std::string& n) {
    return static_cast<int>(std::find(dim_names_.begin(), dim_names_.end(), n) - dim_names_.begin());
  };
  dim_size_.assign(dim_names_.size(), 1);
  dim_stride_.assign(dim_names_.size(), 1);
  dim_sequence_.assign(dim_names_.size(), false);
  for (const auto& n : options.sequence) {
    const int d = dim_index(n);
    if (d < 3 || d == static_cast<int>(dim_names_.size()))
      throw Error("device mesh: the sequence axis \"" + n + "\" must be one of the job's own dimensions (" +
                  join(dim_names_, ", ") + ")");
    dim_sequence_[d] = true;
  }
  for (size_t i = 0; i < names.size(); ++i) dim_size_[dim_index(names[i])] = shape[i];
  order_ = join(names);
  int stride = 1;
  for (size_t i = layout.size(); i-- > 0;) {
    const int d = dim_index(layout[i]);
    dim_stride_[d] = stride;
    stride *= dim_size_[d];
  }

  // Factors: dp splits into (edp, ep) when 1 < ep < dp; every other dimension is one digit.
  const int dp = dim_size_[1], ep = options.ep;
  if (ep < 1 || dp % ep != 0)
    throw Error("device mesh: ep = " + std::to_string(ep) + " must be >= 1 and divide dp = " + std::to_string(dp) +
                " (expert parallelism splits the data-parallel ranks)");
  std::vector<std::vector<int>> of_dim(dim_names_.size());
  for (int d = 0; d < static_cast<int>(dim_names_.size()); ++d) {
    if (d == 1 && ep > 1 && ep < dp) {
      of_dim[d] = {static_cast<int>(factors_.size()), static_cast<int>(factors_.size()) + 1};
      factors_.push_back({d, ep, dp / ep});
      factors_.push_back({d, 1, ep});
    } else {
      of_dim[d] = {static_cast<int>(factors_.size())};
      factors_.push_back({d, 1, dim_size_[d]});
    }
  }
  const auto add = [&](const std::string& name, std::vector<int> factors) {
    defs_.push_back({Axis(name), std::move(factors)});
  };
  for (int d = 0; d < static_cast<int>(dim_names_.size()); ++d) add(dim_names_[d], of_dim[d]);
  const bool split = of_dim[1].size() == 2;
  add("ep", split ? std::vector<int>{of_dim[1][1]} : ep == dp ? of_dim[1] : std::vector<int>{});
  add("edp", split ? std::vector<int>{of_dim[1][0]} : ep == 1 ? of_dim[1] : std::vector<int>{});
  for (const auto& [name, parts] : options.flatten) {
    if (is_core_axis(name) ||
        dim_index(name) < static_cast<int>(dim_names_.size()) ||
        std::any_of(defs_.begin(), defs_.end(), [&](const AxisDef& a) { return name == a.axis.name(); }))
      throw Error("device mesh: flattened axis \"" + name + "\" is already an axis");
    if (parts.size() < 2) throw Error("device mesh: flattened axis \"" + name + "\" must join two or more dimensions");
    std::vector<int> factors;
    for (const auto& p : parts) {
      const int d = dim_index(p);
      if (d == static_cast<int>(dim_names_.size()))
        throw Error("device mesh: flattened axis \"" + name + "\" joins \"" + p + "\", which is not a dimension (" +
                    join(dim_names_, ", ") + ")");
      if (std::count(parts.begin(), parts.end(), p) > 1)
        throw Error("device mesh: flattened axis \"" + name + "\" names \"" + p + "\" twice");
      factors.insert(factors.end(), of_dim[d].begin(), of_dim[d].end());
    }
    add(name, factors);
  }
  std::vector<int> mp = of_dim[0];
  for (int d = 2; d < static_cast<int>(dim_names_.size()); ++d)
    if (!dim_sequence_[d]) mp.insert(mp.end(), of_dim[d].begin(), of_dim[d].end());
  add("mp", mp);
  std::vector<int> world;
  for (const auto& n : layout) world.insert(world.end(), of_dim[dim_index(n)].begin(), of_dim[dim_index(n)].end());
  add("world", world);
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

std::vector<Axis> DeviceMesh::model_axes() const {
  std::vector<Axis> out;
  for (size_t d = 2; d < dim_names_.size(); ++d)
    if (!dim_sequence_[d]) out.push_back(Axis(dim_names_[d]));
  return out;
}

std::vector<Axis> DeviceMesh::sequence_axes() const {
  std::vector<Axis> out;
  for (size_t d = 2; d < dim_names_.size(); ++d)
    if (dim_sequence_[d]) out.push_back(Axis(dim_names_[d]));
  return out;
}

std::vector<Axis> DeviceMesh::rule_axes() const {
  std::vector<Axis> out = model_axes();
  for (const Axis& a : sequence_axes()) out.push_back(a);
  out.push_back(Axis::EP);
  return out;
}

AxisRole DeviceMesh::role(const Axis& axis) const {
  for (size_t d = 0; d < dim_names_.size(); ++d)
    if (dim_names_[d] == axis.name())
      return d == 1 ? AxisRole::SplitsBatch : dim_sequence_[d] ? AxisRole::SplitsSequence : AxisRole::SplitsModel;
  return AxisRole::Derived;
}

bool DeviceMesh::is_data_axis(const Axis& axis) const {
  const auto& f = def(axis).factors;
  if (axis == Axis::EP || axis == Axis::EDP) return true;  // splits of dp, of whatever size
  return std::any_of(f.begin(), f.end(), [&](int i) { return factors_[i].dim == 1; });
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
  for (size_t d = 2; d < dim_names_.size(); ++d)
    if (!dim_sequence_[d] && (rank_ / dim_stride_[d]) % dim_size_[d] != 0) return false;
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
