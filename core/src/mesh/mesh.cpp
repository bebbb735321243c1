// DeviceMesh: rank <-> (pp, dp, tp) coordinates and the groups along each axis.
#include <smp/error.h>
#include <smp/mesh.h>

#include <algorithm>
#include <cctype>

namespace smp {

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::PP: return "pp";
    case Axis::DP: return "dp";
    case Axis::TP: return "tp";
    case Axis::EP: return "ep";
    case Axis::EDP: return "edp";
    case Axis::MP: return "mp";
    case Axis::World: return "world";
  }
  return "?";
}

const std::vector<Axis>& all_axes() {
  static const std::vector<Axis> axes{Axis::PP, Axis::DP, Axis::TP, Axis::EP, Axis::EDP, Axis::MP, Axis::World};
  return axes;
}

Axis axis_from_name(const std::string& name) {
  std::string known;
  for (Axis a : all_axes()) {
    if (name == axis_name(a)) return a;
    known += std::string(known.empty() ? "" : ", ") + axis_name(a);
  }
  throw Error("device mesh: no axis named \"" + name + "\" (known: " + known + ")");
}

namespace {

std::vector<std::string> parse_order(const std::string& order) {
  if (order == "cluster") return {"pp", "dp", "tp"};
  if (order == "spread") return {"pp", "tp", "dp"};
  std::vector<std::string> parts;
  std::string cur;
  for (char c : order + ",") {
    if (c == ',') {
      parts.push_back(cur);
      cur.clear();
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      cur += c;
    }
  }
  std::vector<std::string> sorted = parts;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != std::vector<std::string>{"dp", "pp", "tp"})
    throw Error("device mesh: invalid order \"" + order +
                "\": expected a permutation of pp,dp,tp (slowest- to fastest-varying), or cluster/spread");
  return parts;
}

}  // namespace

DeviceMesh::DeviceMesh(int world_size, int rank, int pp, int dp, int tp, const std::string& order, int ep)
    : world_(world_size), rank_(rank), pp_(pp), dp_(dp), tp_(tp), ep_(ep) {
  if (pp < 1 || dp < 1 || tp < 1)
    throw Error("device mesh: degrees must be >= 1, got pp=" + std::to_string(pp) + " dp=" + std::to_string(dp) +
                " tp=" + std::to_string(tp));
  if (ep < 1 || dp % ep != 0)
    throw Error("device mesh: ep = " + std::to_string(ep) + " must be >= 1 and divide dp = " + std::to_string(dp) +
                " (expert parallelism splits the data-parallel ranks)");
  if (static_cast<long long>(pp) * dp * tp != world_size)
    throw Error("device mesh: pp*dp*tp = " + std::to_string(pp) + "*" + std::to_string(dp) + "*" +
                std::to_string(tp) + " = " + std::to_string(static_cast<long long>(pp) * dp * tp) +
                " does not equal the world size " + std::to_string(world_size));
  if (rank < 0 || rank >= world_size)
    throw Error("device mesh: rank " + std::to_string(rank) + " is outside [0, " + std::to_string(world_size) + ")");
  auto parts = parse_order(order);
  order_ = parts[0] + "," + parts[1] + "," + parts[2];
  // Fastest axis has stride 1.
  int stride = 1;
  for (int i = 2; i >= 0; --i) {
    if (parts[i] == "pp") stride_pp_ = stride, stride *= pp_;
    else if (parts[i] == "dp") stride_dp_ = stride, stride *= dp_;
    else stride_tp_ = stride, stride *= tp_;
  }
}

int DeviceMesh::size(Axis axis) const {
  switch (axis) {
    case Axis::PP: return pp_;
    case Axis::DP: return dp_;
    case Axis::TP: return tp_;
    case Axis::EP: return ep_;
    case Axis::EDP: return dp_ / ep_;
    case Axis::MP: return pp_ * tp_;
    case Axis::World: return world_;
  }
  return 1;
}

int DeviceMesh::coord_of(int r, Axis axis) const {
  if (r < 0 || r >= world_)
    throw Error("device mesh: rank " + std::to_string(r) + " is outside [0, " + std::to_string(world_) + ")");
  const int p = (r / stride_pp_) % pp_, d = (r / stride_dp_) % dp_, t = (r / stride_tp_) % tp_;
  switch (axis) {
    case Axis::PP: return p;
    case Axis::DP: return d;
    case Axis::TP: return t;
    case Axis::EP: return d % ep_;
    case Axis::EDP: return d / ep_;
    case Axis::MP: return p * tp_ + t;
    case Axis::World: return r;
  }
  return 0;
}

int DeviceMesh::coord(Axis axis) const { return coord_of(rank_, axis); }

int DeviceMesh::rank_of(int pp_i, int dp_i, int tp_i) const {
  if (pp_i < 0 || pp_i >= pp_ || dp_i < 0 || dp_i >= dp_ || tp_i < 0 || tp_i >= tp_)
    throw Error("device mesh: coordinates (pp=" + std::to_string(pp_i) + ", dp=" + std::to_string(dp_i) +
                ", tp=" + std::to_string(tp_i) + ") are outside the mesh pp=" + std::to_string(pp_) +
                " dp=" + std::to_string(dp_) + " tp=" + std::to_string(tp_));
  return pp_i * stride_pp_ + dp_i * stride_dp_ + tp_i * stride_tp_;
}

std::vector<int> DeviceMesh::group_of(int r, Axis axis) const {
  const int p = coord_of(r, Axis::PP), d = coord_of(r, Axis::DP), t = coord_of(r, Axis::TP);
  std::vector<int> g;
  switch (axis) {
    case Axis::PP:
      for (int i = 0; i < pp_; ++i) g.push_back(rank_of(i, d, t));
      break;
    case Axis::DP:
      for (int i = 0; i < dp_; ++i) g.push_back(rank_of(p, i, t));
      break;
    case Axis::TP:
      for (int i = 0; i < tp_; ++i) g.push_back(rank_of(p, d, i));
      break;
    case Axis::EP:
      for (int i = 0; i < ep_; ++i) g.push_back(rank_of(p, d - d % ep_ + i, t));
      break;
    case Axis::EDP:
      for (int i = 0; i < dp_ / ep_; ++i) g.push_back(rank_of(p, d % ep_ + i * ep_, t));
      break;
    case Axis::MP:
      for (int i = 0; i < pp_; ++i)
        for (int j = 0; j < tp_; ++j) g.push_back(rank_of(i, d, j));
      break;
    case Axis::World:
      for (int i = 0; i < world_; ++i) g.push_back(i);
      break;
  }
  return g;
}

std::vector<int> DeviceMesh::group(Axis axis) const { return group_of(rank_, axis); }

// Groups are numbered by the coordinates that stay fixed along the axis, in
// (pp, dp, tp) order: pp groups by (dp, tp), dp groups by (pp, tp), tp groups
// by (pp, dp), ep groups by (pp, dp / ep, tp), edp groups by (pp, dp % ep, tp),
// mp groups by dp.
int DeviceMesh::index_of(int r, Axis axis) const {
  const int p = coord_of(r, Axis::PP), d = coord_of(r, Axis::DP), t = coord_of(r, Axis::TP);
  switch (axis) {
    case Axis::PP: return d * tp_ + t;
    case Axis::DP: return p * tp_ + t;
    case Axis::TP: return p * dp_ + d;
    case Axis::EP: return (p * (dp_ / ep_) + d / ep_) * tp_ + t;
    case Axis::EDP: return (p * ep_ + d % ep_) * tp_ + t;
    case Axis::MP: return d;
    case Axis::World: return 0;
  }
  return 0;
}

int DeviceMesh::group_index(Axis axis) const { return index_of(rank_, axis); }

std::string DeviceMesh::group_name(Axis axis) const {
  return std::string(axis_name(axis)) + "." + std::to_string(group_index(axis));
}

std::vector<std::vector<int>> DeviceMesh::all_groups(Axis axis) const {
  const int n = world_ / size(axis);
  std::vector<std::vector<int>> groups(n);
  for (int r = 0; r < world_; ++r) {
    auto& g = groups[index_of(r, axis)];
    if (g.empty()) g = group_of(r, axis);
  }
  return groups;
}

}  // namespace smp
