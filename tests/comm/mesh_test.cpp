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

// A generic named mesh: a dimension the core does not know ("cp"), a
// flattened axis over two dimensions, and the axes by name.
TEST(MeshTest, NamedDimensionsAndDerivedAxes) {
  smp::MeshOptions opts;
  opts.flatten = {{"dp_cp", {"dp", "cp"}}};
  // rank = dp*4 + cp*2 + tp; rank 5 is dp 1, cp 0, tp 1.
  DeviceMesh m(8, 5, {2, 2, 2}, {"dp", "cp", "tp"}, opts);
  const Axis cp = m.axis("cp"), dp_cp = m.axis("dp_cp");
  EXPECT_EQ(m.order(), "dp,cp,tp");
  EXPECT_EQ(m.pp(), 1);
  EXPECT_EQ(m.size(cp), 2);
  EXPECT_EQ(m.coord(cp), 0);
  EXPECT_EQ(m.group(cp), (std::vector<int>{5, 7}));
  EXPECT_EQ(m.all_groups(cp), (G{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.group(dp_cp), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(m.coord(dp_cp), 2);
  EXPECT_EQ(m.group(Axis::MP), (std::vector<int>{4, 6, 5, 7}));  // pp, tp, cp: tp before the job's axes
  EXPECT_EQ(m.group(Axis::World), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  std::vector<std::string> names;
  for (const Axis& a : m.axes()) names.push_back(a.name());
  EXPECT_EQ(names, (std::vector<std::string>{"pp", "dp", "tp", "cp", "ep", "edp", "dp_cp", "mp", "world"}));
  EXPECT_EQ(m.model_axes(), (std::vector<Axis>{Axis::TP, cp}));
  EXPECT_EQ(m.rule_axes(), (std::vector<Axis>{Axis::TP, cp, Axis::EP}));
  EXPECT_TRUE(m.is_data_axis(dp_cp));
  EXPECT_TRUE(m.is_data_axis(Axis::EP));
  EXPECT_FALSE(m.is_data_axis(cp));
  EXPECT_FALSE(m.at_model_origin());  // tp 1
  EXPECT_TRUE(DeviceMesh(8, 4, {2, 2, 2}, {"dp", "cp", "tp"}).at_model_origin());
  EXPECT_FALSE(DeviceMesh(8, 6, {2, 2, 2}, {"dp", "cp", "tp"}).at_model_origin());  // cp 1
  EXPECT_EQ(m.group_name(cp), "cp.3");  // the fixed coordinates in dimension order: pp 0, dp 1, tp 1
}

// Roles: the same dimension declared as a sequence axis (parallel.cp) is no
// model axis: a loss or gradient is a partial sum over it, so every rank of it
// counts (at_model_origin looks at tp alone), rules still apply on it (after
// the model axes), and one replica of the model (mp) leaves it out.
TEST(MeshTest, ASequenceAxisHasItsOwnRole) {
  smp::MeshOptions opts;
  opts.sequence = {"cp"};
  // rank = dp*4 + cp*2 + tp; rank 6 is dp 1, cp 1, tp 0.
  DeviceMesh m(8, 6, {2, 2, 2}, {"dp", "cp", "tp"}, opts);
  const Axis cp = m.axis("cp");
  EXPECT_EQ(m.role(cp), smp::AxisRole::SplitsSequence);
  EXPECT_EQ(m.role(Axis::DP), smp::AxisRole::SplitsBatch);
  EXPECT_EQ(m.role(Axis::TP), smp::AxisRole::SplitsModel);
  EXPECT_EQ(m.role(Axis::PP), smp::AxisRole::SplitsModel);
  EXPECT_EQ(m.role(Axis::EP), smp::AxisRole::Derived);
  EXPECT_EQ(m.model_axes(), (std::vector<Axis>{Axis::TP}));
  EXPECT_EQ(m.sequence_axes(), (std::vector<Axis>{cp}));
  EXPECT_EQ(m.rule_axes(), (std::vector<Axis>{Axis::TP, cp, Axis::EP}));
  EXPECT_FALSE(m.is_data_axis(cp));
  EXPECT_TRUE(m.at_model_origin());  // cp 1 but tp 0
  EXPECT_FALSE(DeviceMesh(8, 7, {2, 2, 2}, {"dp", "cp", "tp"}, opts).at_model_origin());  // tp 1
  EXPECT_EQ(m.group(Axis::MP), (std::vector<int>{6, 7}));  // pp 1 x tp 2, without cp
  EXPECT_EQ(m.group(cp), (std::vector<int>{4, 6}));
  smp::MeshOptions bad;
  bad.sequence = {"tp"};
  EXPECT_THROW(DeviceMesh(8, 0, {2, 2, 2}, {"dp", "cp", "tp"}, bad), smp::Error);
}

TEST(MeshTest, NamedDimensionsRoundTripAndPartition) {
  const std::vector<std::vector<std::string>> orders = {
      {"pp", "dp", "cp", "tp"}, {"cp", "pp", "tp", "dp"}, {"tp", "cp", "dp", "pp"}};
  for (const auto& order : orders)
    for (int cp : {1, 2, 3})
      for (int ep : {1, 2}) {
        std::vector<int> shape;
        for (const auto& n : order) shape.push_back(n == "pp" ? 2 : n == "dp" ? 4 : n == "cp" ? cp : 2);
        const int world = 2 * 4 * cp * 2;
        smp::MeshOptions opts;
        opts.ep = ep;
        opts.flatten = {{"cp_dp", {"cp", "dp"}}};
        for (int r = 0; r < world; ++r) {
          DeviceMesh m(world, r, shape, order, opts);
          for (const Axis& a : m.axes()) {
            auto g = m.group(a);
            ASSERT_EQ(static_cast<int>(g.size()), m.size(a)) << a.name();
            if (a != Axis::World) EXPECT_EQ(g[m.coord(a)], r) << a.name();
            auto all = m.all_groups(a);
            EXPECT_EQ(all[m.group_index(a)], g) << a.name();
            std::set<int> seen;
            for (const auto& grp : all)
              for (int x : grp) EXPECT_TRUE(seen.insert(x).second) << "rank in two groups of " << a.name();
            EXPECT_EQ(static_cast<int>(seen.size()), world);
          }
          EXPECT_EQ(m.size(m.axis("cp_dp")), cp * 4);
        }
      }
}

TEST(MeshTest, NamedDimensionErrors) {
  auto msg = [](auto f) {
    try {
      f();
    } catch (const smp::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  DeviceMesh m(4, 0, {2, 2}, {"cp", "dp"});
  EXPECT_NE(msg([&] { m.axis("xp"); }).find("no axis named \"xp\" (this job's mesh has: pp, dp, tp, cp, ep, edp, mp, world)"),
            std::string::npos);
  EXPECT_NE(msg([&] { m.size(Axis("sp")); }).find("no axis named \"sp\""), std::string::npos);
  EXPECT_NE(msg([] { DeviceMesh(4, 0, {2, 3}, {"cp", "dp"}); }).find("cp*dp = 2*3 = 6 does not equal the world size 4"),
            std::string::npos);
  EXPECT_NE(msg([] { DeviceMesh(4, 0, {2, 2}, {"cp", "cp"}); }).find("named twice"), std::string::npos);
  EXPECT_NE(msg([] { DeviceMesh(4, 0, {2, 2}, {"ep", "dp"}); }).find("\"ep\" is a derived axis"), std::string::npos);
  EXPECT_NE(msg([] { DeviceMesh(4, 0, {2, 2}, {"Cp", "dp"}); }).find("invalid axis name \"Cp\""), std::string::npos);
  smp::MeshOptions bad;
  bad.flatten = {{"dp_xp", {"dp", "xp"}}};
  EXPECT_NE(msg([&] { DeviceMesh(4, 0, {2, 2}, {"cp", "dp"}, bad); }).find("joins \"xp\", which is not a dimension"),
            std::string::npos);
}

}  // namespace
