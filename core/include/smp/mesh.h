// The device mesh: world ranks laid out as a pp x dp x tp grid, with expert
// parallelism (ep) as a split of dp. Pure C++.
//
// Named axes: "pp", "dp", "tp" are the grid; "ep" splits the dp ranks of one
// (pp, tp) slice into groups of ep consecutive dp indices (the ranks that
// exchange tokens in an expert layer); "edp" is the expert-data-parallel group,
// the dp ranks holding the same experts (dp index = e + k*ep for fixed e), over
// which expert gradients are reduced; "mp" every pp x tp rank at one dp index;
// "world" every rank.
#pragma once

#include <string>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

enum class Axis { PP, DP, TP, EP, EDP, MP, World };
const char* axis_name(Axis axis);  // "pp", "dp", "tp", "ep", "edp", "mp", "world"
// The axis called `name`; throws smp::Error listing the known names.
Axis axis_from_name(const std::string& name);
// Every axis, in the order above.
const std::vector<Axis>& all_axes();

class DeviceMesh {
 public:
  // order: the axes from slowest- to fastest-varying rank index, a permutation
  // of "pp,dp,tp" (spaces allowed); "cluster" = "pp,dp,tp", "spread" = "pp,tp,dp".
  // Throws smp::Error naming the values when pp*dp*tp != world_size, a degree
  // is < 1, rank is out of range or the order is not a permutation.
  // ep must divide dp (1 = no expert parallelism).
  DeviceMesh(int world_size, int rank, int pp, int dp, int tp, const std::string& order = "pp,dp,tp", int ep = 1);

  int world_size() const { return world_; }
  int rank() const { return rank_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int ep() const { return ep_; }
  int size(Axis axis) const;              // group size along an axis (MP: pp*tp, EDP: dp/ep)
  const std::string& order() const { return order_; }  // normalised "pp,dp,tp"

  // This rank's position on an axis: pp/dp/tp index; EP: dp_i % ep; EDP: dp_i / ep;
  // MP: pp_i * tp + tp_i; World: rank.
  int coord(Axis axis) const;
  int coord_of(int rank, Axis axis) const;
  int rank_of(int pp_i, int dp_i, int tp_i) const;

  // The world ranks of this rank's group along `axis`, in axis order (group rank
  // i = element i). MP: ordered by (pp_i, tp_i), pp-major. World: 0..world-1.
  std::vector<int> group(Axis axis) const;
  std::vector<int> group_of(int rank, Axis axis) const;
  // Every group along `axis` (a partition of the world), in group-index order.
  std::vector<std::vector<int>> all_groups(Axis axis) const;
  // Index of this rank's group in all_groups(axis), and a job-unique name for
  // it, e.g. "tp.3" (to pass as Rendezvous::new_communicator's name).
  int group_index(Axis axis) const;
  std::string group_name(Axis axis) const;

 private:
  int index_of(int rank, Axis axis) const;  // group index of `rank`
  int world_, rank_, pp_, dp_, tp_, ep_;
  std::string order_;
  int stride_pp_, stride_dp_, stride_tp_;
};

}  // namespace smp
#pragma GCC visibility pop
