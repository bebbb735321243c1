#include <smp/error.h>
#include <smp/axis_placement.h>
#include <smp/job_config.h>
#include <smp/mesh.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <tuple>
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
    EXPECT_NE(std::string(e.what()).find("no axis named \"xp\" (known: pp, dp, tp, cp, ep, edp, mp, world)"),
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

// ---- The mesh described once (MeshSpec) and decisions by role ----

namespace {

using smp::MeshSpec;
using smp::Role;

smp::ParallelConfig layout(int pp, int dp, int tp, const std::string& placement) {
  smp::ParallelConfig par;
  par.pp = pp;
  par.dp = dp;
  par.tp = tp;
  par.placement = placement;
  return par;
}

std::vector<std::string> names_of(const std::vector<Axis>& axes) {
  std::vector<std::string> out;
  for (const Axis& a : axes) out.push_back(a.name());
  return out;
}

}  // namespace

// MeshSpec::from reads every parallel.* key that shapes the mesh, once: each
// dimension's name, size and role in rank order, the derived axes with their
// parts; the DeviceMesh laid out from it is the one the names give.
TEST(MeshSpecTest, TheJobsLayoutIsOneDescription) {
  smp::ParallelConfig par = layout(2, 4, 1, "pp,dp,cp,tp");
  par.cp = 2;
  par.ep = 2;
  par.flatten = {{"dp_cp", {"dp", "cp"}}};
  const MeshSpec spec = MeshSpec::from(par);
  EXPECT_EQ(spec.world_size(), 16);
  EXPECT_EQ(spec.order(), "pp,dp,cp,tp");
  std::vector<std::tuple<std::string, int, Role>> dims;
  for (const auto& d : spec.dims()) dims.emplace_back(d.name, d.size, d.role);
  EXPECT_EQ(dims, (std::vector<std::tuple<std::string, int, Role>>{{"pp", 2, Role::Pipeline},
                                                                  {"dp", 4, Role::Batch},
                                                                  {"cp", 2, Role::Sequence},
                                                                  {"tp", 1, Role::Model}}));
  std::vector<std::tuple<std::string, Role, std::vector<std::string>>> derived;
  for (const auto& d : spec.derived()) derived.emplace_back(d.name, d.role, d.parts);
  EXPECT_EQ(derived, (std::vector<std::tuple<std::string, Role, std::vector<std::string>>>{
                         {"ep", Role::Expert, {"dp"}},
                         {"edp", Role::ExpertBatch, {"dp"}},
                         {"dp_cp", Role::Joined, {"dp", "cp"}},
                         {"mp", Role::Replica, {"pp", "tp"}},
                         {"world", Role::World, {"pp", "dp", "cp", "tp"}}}));
  smp::MeshOptions o;
  o.ep = 2;
  o.sequence = {"cp"};
  o.flatten = par.flatten;
  for (int r = 0; r < 16; ++r) {
    const DeviceMesh from_spec(spec, r), by_names(16, r, {2, 4, 2, 1}, {"pp", "dp", "cp", "tp"}, o);
    ASSERT_EQ(names_of(from_spec.axes()), names_of(by_names.axes()));
    for (const Axis& a : by_names.axes()) {
      EXPECT_EQ(from_spec.group(a), by_names.group(a)) << a.name() << " rank " << r;
      EXPECT_EQ(from_spec.group_name(a), by_names.group_name(a)) << a.name() << " rank " << r;
      EXPECT_EQ(from_spec.role_of(a), by_names.role_of(a)) << a.name();
    }
  }
}

// The one axis of a role, every axis of one, and a role's name both ways.
TEST(MeshSpecTest, DecisionsAskRoles) {
  smp::ParallelConfig par = layout(2, 2, 2, "pp,dp,tp,tok");
  par.axes = {{"tok", 1}};
  const DeviceMesh m(MeshSpec::from(par), 5);
  EXPECT_EQ(m.axis_with(Role::Pipeline), Axis::PP);
  EXPECT_EQ(m.axis_with(Role::Batch), Axis::DP);
  EXPECT_EQ(m.axis_with(Role::Expert), Axis::EP);
  EXPECT_EQ(m.axis_with(Role::ExpertBatch), Axis::EDP);
  EXPECT_EQ(m.axis_with(Role::Replica), Axis::MP);
  EXPECT_EQ(m.axis_with(Role::World), Axis::World);
  EXPECT_EQ(names_of(m.axes_with(Role::Model)), (std::vector<std::string>{"tp", "tok"}));
  EXPECT_TRUE(m.axes_with(Role::Sequence).empty());
  EXPECT_THROW(m.axis_with(Role::Model), smp::Error);  // two: ask axes_with
  EXPECT_EQ(m.coord(Role::Pipeline), m.coord(Axis::PP));
  EXPECT_EQ(m.size(Role::Batch), 2);
  EXPECT_EQ(m.role(Axis::PP), smp::AxisRole::SplitsModel);  // the coarse role: what it does to the data
  for (Role r : {Role::Pipeline, Role::Batch, Role::Sequence, Role::Model, Role::Expert, Role::ExpertBatch,
                 Role::Joined, Role::Replica, Role::World})
    EXPECT_EQ(smp::role_from_string(smp::to_string(r)), r);
  EXPECT_THROW(smp::role_from_string("data"), smp::Error);
  // One list of the core's own names, each with its role.
  ASSERT_NE(smp::builtin_axis("cp"), nullptr);
  EXPECT_EQ(smp::builtin_axis("cp")->role, Role::Sequence);
  EXPECT_EQ(smp::builtin_axis("tok"), nullptr);
}

// A job's axis declared with the sequence role (parallel.axes + parallel.
// sequence_axes) is laid out and asked about exactly as parallel.cp's is.
TEST(MeshSpecTest, AJobsSequenceAxisWorksLikeCp) {
  smp::ParallelConfig cp = layout(1, 2, 2, "pp,dp,cp,tp"), seq = layout(1, 2, 2, "pp,dp,seq,tp");
  cp.cp = 2;
  seq.axes = {{"seq", 2}};
  seq.sequence_axes = {"seq"};
  for (int r = 0; r < 8; ++r) {
    const DeviceMesh a(MeshSpec::from(cp), r), b(MeshSpec::from(seq), r);
    const Axis ca = a.axis("cp"), sb = b.axis("seq");
    EXPECT_EQ(b.role_of(sb), Role::Sequence);
    EXPECT_EQ(b.role(sb), smp::AxisRole::SplitsSequence);
    EXPECT_EQ(b.sequence_axes(), std::vector<Axis>{sb});
    EXPECT_EQ(b.model_axes(), std::vector<Axis>{Axis::TP});
    EXPECT_EQ(b.rule_axes(), (std::vector<Axis>{Axis::TP, sb, Axis::EP}));
    EXPECT_EQ(b.at_model_origin(), a.at_model_origin()) << r;
    EXPECT_EQ(b.is_data_axis(sb), a.is_data_axis(ca));
    EXPECT_EQ(b.group(sb), a.group(ca)) << r;
    for (const Axis& x : {Axis::DP, Axis::TP, Axis::MP, Axis::EDP, Axis::World})
      EXPECT_EQ(b.group(x), a.group(x)) << x.name() << " rank " << r;
  }
  // Without the role the same axis splits the model.
  seq.sequence_axes.clear();
  EXPECT_EQ(DeviceMesh(MeshSpec::from(seq), 0).role_of(Axis("seq")), Role::Model);
}

TEST(MeshSpecTest, RolesTheCoreOwnsAreRefusedElsewhere) {
  const auto msg = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const smp::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(msg([] { MeshSpec({{"pp", 2, Role::Model}}); }).find("\"pp\" cannot have the role model"), std::string::npos);
  EXPECT_NE(msg([] { MeshSpec({{"rows", 2, Role::Batch}}); }).find("\"rows\" cannot have the role batch"),
            std::string::npos);
  EXPECT_NE(msg([] { MeshSpec({{"tok", 2, Role::Expert}}); }).find("no dimension has"), std::string::npos);
  EXPECT_NE(msg([] { MeshSpec({{"edp", 2, Role::Model}}); }).find("\"edp\" is a derived axis"), std::string::npos);
  EXPECT_NE(msg([] { MeshSpec({{"dp", 4, Role::Batch}}, 3); }).find("ep = 3 must be >= 1 and divide dp = 4"),
            std::string::npos);
  EXPECT_NE(msg([] { DeviceMesh(MeshSpec({{"dp", 4, Role::Batch}}), 4); }).find("rank 4 is outside [0, 4)"),
            std::string::npos);
  const DeviceMesh one(MeshSpec{}, 0);  // a default spec is the one-rank mesh
  EXPECT_EQ(one.world_size(), 1);
  EXPECT_EQ(one.order(), "pp,dp,tp");
}

// DTensor-style placements as the manifest writes them.
TEST(MeshSpecTest, PlacementsAsText) {
  for (const std::string text : {"replicate", "shard(0)", "shard(12)", "partial"}) {
    const smp::AxisPlacement p = smp::placement_from_string(text, "tp", Role::Model);
    EXPECT_EQ(smp::to_string(p), text);
    EXPECT_EQ(p.axis, "tp");
  }
  EXPECT_EQ(smp::placement_from_string("shard(2)", "ep", Role::Expert).dim, 2);
  for (const char* bad : {"shard()", "shard(x)", "Shard(1)", "shard(-1)", ""})
    EXPECT_THROW(smp::placement_from_string(bad, "tp", Role::Model), smp::Error) << bad;
}
