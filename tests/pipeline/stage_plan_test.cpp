// StagePlan::build: what each virtual stage runs, what it sends on (values
// crossing several stages travel through every one in between), which graph
// inputs it reads, and the assignments it refuses.
#include <smp/error.h>
#include <smp/stage_plan.h>

#include <gtest/gtest.h>

#include "graph_node.h"

namespace {

using smp_test::node;

// x -> a -> b -> c -> d(+ skip from a, + y) -> loss
smp::ModelGraph chain() {
  smp::ModelGraph g;
  g.inputs = {"x", "y"};
  g.nodes = {node("a", "k", "{}", {"x"}, {"va"}), node("b", "k", "{}", {"va"}, {"vb"}),
             node("c", "k", "{}", {"vb"}, {"vc"}), node("d", "k", "{}", {"vc", "va", "y"}, {"loss"})};
  g.loss = "loss";
  return g;
}

TEST(StagePlan, ValuesTravelThroughEveryStageInBetween) {
  smp::StagePlan p = smp::StagePlan::build(chain(), {0, 1, 2, 3}, 2, 2);  // 4 virtual stages on 2 ranks
  EXPECT_EQ(p.num_stages(), 4);
  EXPECT_EQ(p.rank_of(3), 1);
  EXPECT_EQ(p.chunk_of(3), 1);
  EXPECT_EQ(p.nodes_of_stage[2], (std::vector<int>{2}));
  // "va" is read on stage 3: stages 0, 1 and 2 all send it on.
  EXPECT_EQ(p.sent_after[0], (std::vector<std::string>{"va"}));
  EXPECT_EQ(p.sent_after[1], (std::vector<std::string>{"va", "vb"}));
  EXPECT_EQ(p.sent_after[2], (std::vector<std::string>{"va", "vc"}));
  EXPECT_TRUE(p.sent_after[3].empty());
  EXPECT_EQ(p.inputs_of_stage[0], (std::vector<std::string>{"x"}));
  EXPECT_EQ(p.inputs_of_stage[3], (std::vector<std::string>{"y"}));  // read from the batch where used
  EXPECT_TRUE(p.inputs_of_stage[1].empty());
}

// A loss count computed before the last stage travels there like any value.
TEST(StagePlan, CarriesTheLossCountToTheLastStage) {
  smp::ModelGraph g = chain();
  g.loss_reduction = smp::ModelGraph::LossReduction::Sum;
  g.loss_count = "va";  // produced on stage 0, read by nothing but the loss
  g.nodes[3].inputs = {"vc", "y"};
  smp::StagePlan p = smp::StagePlan::build(g, {0, 1, 1, 2}, 3, 1);
  EXPECT_EQ(p.sent_after[0], (std::vector<std::string>{"va"}));
  EXPECT_EQ(p.sent_after[1], (std::vector<std::string>{"va", "vc"}));
  EXPECT_TRUE(p.sent_after[2].empty());
}

TEST(StagePlan, RefusesBackwardEdgesEmptyStagesAndALossNotLast) {
  auto msg = [](std::vector<int> st, int pp) {
    try {
      smp::StagePlan::build(chain(), std::move(st), pp, 1);
    } catch (const smp::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg({0, 1, 0, 1}, 2), "");  // c reads b from a later stage
  EXPECT_NE(msg({0, 0, 0, 0}, 2), "");  // stage 1 empty, loss not on the last stage
  EXPECT_NE(msg({0, 1, 1, 2}, 2), "");  // stage 2 of 2
  EXPECT_EQ(msg({0, 0, 1, 1}, 2), "");
}

}  // namespace
