// Placements from the ABI: what is accepted, what is refused (by name), which
// data-parallel group a gradient is averaged over, and who counts a value once.
#include "mesh/placement.h"
#include "plugin/placement_abi.h"

#include <smp/error.h>

#include <gtest/gtest.h>

namespace {

using smp::Axis;
using smp::Placements;

smp_placement pl(const char* axis, smp_placement_kind kind, int dim = -1) {
  smp_placement p{};
  p.struct_size = SMP_PLACEMENT_STRUCT_SIZE;
  p.axis = axis;
  p.kind = kind;
  p.dim = dim;
  return p;
}

std::string error_of(std::vector<smp_placement> v, int64_t ndim) {
  try {
    smp::placements_from_abi(v.data(), v.size(), ndim, "parameter 'w'");
  } catch (const smp::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Placements, ShardedPartialAndReplicated) {
  std::vector<smp_placement> v = {pl("tp", SMP_PLACEMENT_SHARD, 1), pl("dp", SMP_PLACEMENT_REPLICATE)};
  Placements p = smp::placements_from_abi(v.data(), v.size(), 2, "w");
  EXPECT_TRUE(p.sharded(Axis::TP));
  EXPECT_EQ(p.shard_dim(Axis::TP), 1);
  EXPECT_EQ(p.kind(Axis::DP), smp::PlacementKind::Replicate);
  EXPECT_EQ(p.kind(Axis::EP), smp::PlacementKind::Replicate);  // not listed = replicated
  EXPECT_EQ(p.data_parallel_axis(), Axis::DP);
  std::vector<smp_placement> norm = {pl("tp", SMP_PLACEMENT_PARTIAL_GRAD)};
  EXPECT_TRUE(smp::placements_from_abi(norm.data(), 1, 1, "ln").partial_grad(Axis::TP));
  std::vector<smp_placement> expert = {pl("ep", SMP_PLACEMENT_SHARD, 0)};
  EXPECT_EQ(smp::placements_from_abi(expert.data(), 1, 3, "e").data_parallel_axis(), Axis::EDP);
}

TEST(Placements, RefusalsNameTheParameterAndTheProblem) {
  EXPECT_NE(error_of({pl("pp", SMP_PLACEMENT_SHARD, 0)}, 2).find("parameter 'w': placement on axis 'pp'"),
            std::string::npos);
  EXPECT_NE(error_of({pl("tp", SMP_PLACEMENT_SHARD, 2)}, 2).find("shard dimension 2 on axis 'tp'"), std::string::npos);
  EXPECT_NE(error_of({pl("tp", SMP_PLACEMENT_SHARD, 0), pl("tp", SMP_PLACEMENT_PARTIAL_GRAD)}, 2)
                .find("two placements on axis 'tp'"),
            std::string::npos);
  EXPECT_NE(error_of({pl("dp", SMP_PLACEMENT_SHARD, 0)}, 2).find("memory manager"), std::string::npos);
  smp_placement small = pl("tp", SMP_PLACEMENT_SHARD, 0);
  small.struct_size = 8;
  EXPECT_NE(error_of({small}, 2).find("struct_size 8"), std::string::npos);
}

TEST(Placements, EachDistinctValueIsCountedOnce) {
  // dp 4 x tp 2 with ep 2 (rank = dp * 2 + tp).
  std::vector<smp_placement> tp_shard = {pl("tp", SMP_PLACEMENT_SHARD, 0)};
  std::vector<smp_placement> expert = {pl("ep", SMP_PLACEMENT_SHARD, 0)};
  Placements shard = smp::placements_from_abi(tp_shard.data(), 1, 2, "a");
  Placements rep;
  Placements exp = smp::placements_from_abi(expert.data(), 1, 2, "e");
  int shard_n = 0, rep_n = 0, exp_n = 0;
  for (int r = 0; r < 8; ++r) {
    smp::DeviceMesh m(8, r, 1, 4, 2, "pp,dp,tp", 2);
    shard_n += shard.counted_on(m), rep_n += rep.counted_on(m), exp_n += exp.counted_on(m);
  }
  EXPECT_EQ(shard_n, 2);  // one per tp shard
  EXPECT_EQ(rep_n, 1);
  EXPECT_EQ(exp_n, 2);    // one per ep shard (edp coordinate 0)
}

}  // namespace
