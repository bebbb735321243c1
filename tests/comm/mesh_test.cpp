#include <smp/error.h>
#include <smp/mesh.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace {

using smp::Axis;
using smp::DeviceMesh;
using G = std::vector<std::vector<int>>;

TEST(MeshTest, DefaultOrderTpFastest) {
  // world 8 = pp2 x dp2 x tp2, order pp,dp,tp: rank = pp*4 + dp*2 + tp.
  DeviceMesh m(8, 5, 2, 2, 2);
  EXPECT_EQ(m.coord(Axis::PP), 1);
  EXPECT_EQ(m.coord(Axis::DP), 0);
  EXPECT_EQ(m.coord(Axis::TP), 1);
  EXPECT_EQ(m.coord(Axis::MP), 3);
  EXPECT_EQ(m.coord(Axis::World), 5);
  EXPECT_EQ(m.rank_of(1, 0, 1), 5);
  EXPECT_EQ(m.group(Axis::TP), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group(Axis::DP), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.group(Axis::PP), (std::vector<int>{1, 5}));
  EXPECT_EQ(m.group(Axis::MP), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(m.group(Axis::World), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(m.all_groups(Axis::TP), (G{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.all_groups(Axis::DP), (G{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.all_groups(Axis::PP), (G{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.all_groups(Axis::MP), (G{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(m.group_name(Axis::TP), "tp.2");
  EXPECT_EQ(m.group_name(Axis::World), "world.0");
}

TEST(MeshTest, SpreadOrderDpFastest) {
  // order pp,tp,dp: rank = pp*4 + tp*2 + dp.
  DeviceMesh m(8, 5, 2, 2, 2, "spread");
  EXPECT_EQ(m.order(), "pp,tp,dp");
  EXPECT_EQ(m.coord(Axis::PP), 1);
  EXPECT_EQ(m.coord(Axis::TP), 0);
  EXPECT_EQ(m.coord(Axis::DP), 1);
  EXPECT_EQ(m.group(Axis::DP), (std::vector<int>{4, 5}));
  EXPECT_EQ(m.group(Axis::TP), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.all_groups(Axis::MP), (G{{0, 2, 4, 6}, {1, 3, 5, 7}}));
}

TEST(MeshTest, ShapesWorld4) {
  DeviceMesh pp2tp2(4, 0, 2, 1, 2);
  EXPECT_EQ(pp2tp2.all_groups(Axis::TP), (G{{0, 1}, {2, 3}}));
  EXPECT_EQ(pp2tp2.all_groups(Axis::PP), (G{{0, 2}, {1, 3}}));
  EXPECT_EQ(pp2tp2.all_groups(Axis::DP), (G{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(pp2tp2.all_groups(Axis::MP), (G{{0, 1, 2, 3}}));
  DeviceMesh dp2tp2(4, 3, 1, 2, 2);
  EXPECT_EQ(dp2tp2.all_groups(Axis::DP), (G{{0, 2}, {1, 3}}));
  EXPECT_EQ(dp2tp2.all_groups(Axis::MP), (G{{0, 1}, {2, 3}}));
  DeviceMesh tp4(4, 2, 1, 1, 4);
  EXPECT_EQ(tp4.group(Axis::TP), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(tp4.coord(Axis::TP), 2);
  DeviceMesh order(4, 1, 2, 2, 1, "dp,pp,tp");  // dp slowest: rank = dp*2 + pp
  EXPECT_EQ(order.coord(Axis::PP), 1);
  EXPECT_EQ(order.coord(Axis::DP), 0);
  EXPECT_EQ(order.all_groups(Axis::PP), (G{{0, 1}, {2, 3}}));
}

// Every shape and order: coordinates round-trip and groups partition the world.
TEST(MeshTest, RoundTripAndPartitions) {
  const std::vector<std::string> orders = {"pp,dp,tp", "pp,tp,dp", "dp,pp,tp", "dp,tp,pp", "tp,pp,dp", "tp,dp,pp"};
  for (int pp : {1, 2, 3})
    for (int dp : {1, 2, 4})
      for (int tp : {1, 2, 3})
        for (const auto& order : orders) {
          const int world = pp * dp * tp;
          for (int r = 0; r < world; ++r) {
            DeviceMesh m(world, r, pp, dp, tp, order);
            EXPECT_EQ(m.rank_of(m.coord(Axis::PP), m.coord(Axis::DP), m.coord(Axis::TP)), r);
            for (Axis a : {Axis::PP, Axis::DP, Axis::TP, Axis::MP, Axis::World}) {
              auto g = m.group(a);
              ASSERT_EQ(static_cast<int>(g.size()), m.size(a));
              // this rank sits at its coordinate in its group
              if (a != Axis::World) EXPECT_EQ(g[m.coord(a)], r) << smp::axis_name(a) << " " << order;
              auto all = m.all_groups(a);
              EXPECT_EQ(all[m.group_index(a)], g);
              std::set<int> seen;
              for (const auto& grp : all)
                for (int x : grp) EXPECT_TRUE(seen.insert(x).second) << "rank in two groups";
              EXPECT_EQ(static_cast<int>(seen.size()), world);
            }
          }
        }
}

TEST(MeshTest, Errors) {
  auto msg = [](auto f) {
    try {
      f();
    } catch (const smp::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([] { DeviceMesh(4, 0, 2, 2, 2); }).find("pp*dp*tp = 2*2*2 = 8 does not equal the world size 4"),
            std::string::npos);
  EXPECT_NE(msg([] { DeviceMesh(4, 0, 0, 2, 2); }).find("pp=0"), std::string::npos);
  EXPECT_NE(msg([] { DeviceMesh(4, 4, 1, 4, 1); }).find("rank 4"), std::string::npos);
  EXPECT_NE(msg([] { DeviceMesh(4, 0, 1, 4, 1, "pp,dp"); }).find("invalid order \"pp,dp\""), std::string::npos);
  EXPECT_NE(msg([] { DeviceMesh(4, 0, 1, 4, 1, "pp,dp,xx"); }).find("pp,dp,xx"), std::string::npos);
  DeviceMesh m(4, 0, 1, 4, 1);
  EXPECT_NE(msg([&] { m.rank_of(0, 4, 0); }).find("dp=4"), std::string::npos);
  EXPECT_STREQ(smp::axis_name(Axis::MP), "mp");
}

TEST(MeshTest, ExpertParallelSplitsDpOnFourRanks) {
  // dp = 4, ep = 2: ep groups are consecutive dp indices {0,1} {2,3}; the
  // expert-data-parallel groups hold the same experts: dp indices {0,2} {1,3}.
  for (int r = 0; r < 4; ++r) {
    DeviceMesh m(4, r, 1, 4, 1, "pp,dp,tp", 2);
    EXPECT_EQ(m.ep(), 2);
    EXPECT_EQ(m.size(Axis::EP), 2);
    EXPECT_EQ(m.size(Axis::EDP), 2);
    EXPECT_EQ(m.coord(Axis::EP), r % 2);
    EXPECT_EQ(m.coord(Axis::EDP), r / 2);
    EXPECT_EQ(m.all_groups(Axis::EP), (G{{0, 1}, {2, 3}}));
    EXPECT_EQ(m.all_groups(Axis::EDP), (G{{0, 2}, {1, 3}}));
    EXPECT_EQ(m.group(Axis::EP), (r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}));
    EXPECT_EQ(m.group(Axis::EDP), (r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}));
  }
  // dp2 x tp2 with ep = 2: ep runs along dp inside each tp slice; edp is one rank.
  DeviceMesh m(4, 1, 1, 2, 2, "pp,dp,tp", 2);
  EXPECT_EQ(m.all_groups(Axis::EP), (G{{0, 2}, {1, 3}}));
  EXPECT_EQ(m.all_groups(Axis::EDP), (G{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(m.group_name(Axis::EP), "ep.1");
  // pp2 x dp2, ep = 2, dp fastest ("spread" puts tp between): groups stay inside a stage.
  DeviceMesh s(4, 3, 2, 2, 1, "pp,tp,dp", 2);
  EXPECT_EQ(s.all_groups(Axis::EP), (G{{0, 1}, {2, 3}}));
  EXPECT_EQ(s.group(Axis::EP), (std::vector<int>{2, 3}));
  // ep = 1: each rank is its own expert group; edp is the whole dp group.
  DeviceMesh one(4, 2, 1, 4, 1);
  EXPECT_EQ(one.group(Axis::EP), (std::vector<int>{2}));
  EXPECT_EQ(one.group(Axis::EDP), (std::vector<int>{0, 1, 2, 3}));
}

TEST(MeshTest, AxesByNameAndEpErrors) {
  EXPECT_EQ(smp::axis_from_name("ep"), Axis::EP);
  EXPECT_EQ(smp::axis_from_name("edp"), Axis::EDP);
  try {
    smp::axis_from_name("xp");
    ADD_FAILURE() << "axis xp accepted";
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no axis named \"xp\" (known: pp, dp, tp, ep, edp, mp, world)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(DeviceMesh(4, 0, 1, 4, 1, "pp,dp,tp", 3), smp::Error);
  EXPECT_THROW(DeviceMesh(4, 0, 1, 4, 1, "pp,dp,tp", 0), smp::Error);
}

}  // namespace
