// Every collective on every mesh axis, with real processes (smp-launch) and
// real Gloo over loopback. The checks themselves live in comm_worker.cpp.
#include "proc_util.h"

#include <gtest/gtest.h>

namespace {

struct Shape {
  int world, pp, dp, tp;
  const char* order;
  const char* name;
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.name << " (world " << s.world << ": pp" << s.pp << " dp" << s.dp << " tp" << s.tp << ", order " << s.order
      << ")";
}

class CommTest : public ::testing::TestWithParam<Shape> {};

TEST_P(CommTest, EveryCollectiveMatchesTheSerialResult) {
  const Shape s = GetParam();
  const int port = smp_test::free_port();
  auto r = smp_test::run({SMP_LAUNCH_BIN, "--nproc-per-node", std::to_string(s.world), "--master-port",
                          std::to_string(port), "--kill-timeout", "5", "--worker", SMP_COMM_WORKER, "--mode", "check",
                          "--pp", std::to_string(s.pp), "--dp", std::to_string(s.dp), "--tp", std::to_string(s.tp),
                          "--order", s.order, "--timeout-ms", "30000"},
                         /*timeout_s=*/100);
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // Rank 0 prints to the terminal (here: the captured output).
  EXPECT_TRUE(smp_test::contains(r.output, "rank 0: all checks passed")) << r.output;
  RecordProperty("seconds", std::to_string(r.seconds));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CommTest,
    ::testing::Values(Shape{1, 1, 1, 1, "pp,dp,tp", "w1"}, Shape{2, 1, 2, 1, "pp,dp,tp", "w2_dp2"},
                      Shape{3, 1, 1, 3, "pp,dp,tp", "w3_tp3"},
                      Shape{4, 2, 1, 2, "pp,dp,tp", "w4_pp2_tp2"}, Shape{4, 1, 2, 2, "pp,dp,tp", "w4_dp2_tp2"},
                      Shape{4, 2, 2, 1, "pp,tp,dp", "w4_pp2_dp2_spread"}, Shape{4, 1, 1, 4, "pp,dp,tp", "w4_tp4"}),
    [](const ::testing::TestParamInfo<Shape>& info) { return std::string(info.param.name); });

}  // namespace
