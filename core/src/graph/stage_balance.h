// Whether a partition gives the pipeline anything to overlap: a stage that
// holds only the loss, or one stage with most of the cost, runs the model
// about serially on pp ranks (a model handed over as one node does this).
#pragma once

#include <smp/model_graph.h>
#include <smp/stage_plan.h>

#include <string>

namespace smp {

// The share of the compute cost above which one stage is said to hold the model.
constexpr double kStageCostShareWarning = 0.9;

// "" when the stages share the work, else a sentence naming the stage, its
// nodes or share, and what to do. Needs plan.costs (one per node) for shares.
std::string stage_balance_warning(const ModelGraph& graph, const StagePlan& plan);

}  // namespace smp
