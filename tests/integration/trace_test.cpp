// Timeline traces (run.trace): a pp = 2, 1F1B, m = 4 job writes one Chrome
// trace per rank and a merged one; each rank's schedule actions appear in the
// schedule's order, with the step's phases, data loading and collectives
// (bytes); each rank's idle time during the pipeline phase is the simulator's
// bubble for the measured action costs, within a stated tolerance.
#include "job_runner.h"

#include "schedule/schedule.h"
#include "schedule/schedule_simulator.h"
#include "schedule/traced_pipeline.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

namespace smp::testing {
namespace {

using nlohmann::json;

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return in ? json::parse(in) : json();
}

std::vector<json> events_named(const json& trace, const std::string& category) {
  std::vector<json> out;
  for (const auto& e : trace["traceEvents"])
    if (e.value("cat", "") == category) out.push_back(e);
  return out;
}

TEST(Trace, PipelineActionsInScheduleOrderAndIdleAsSimulated) {
  JobResult r = run_job(2, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"),
                        {"parallel.pp=2", "parallel.schedule=\"1f1b\"", "parallel.microbatches=4", "model.hidden=256",
                         "model.seq_len=128", "train.steps=4", "run.trace=true", "run.trace_steps=[2, 3]",
                         "run.trace_merge=true", "run.dump_parameters=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Schedule schedule = make_schedule("1f1b", 2, 4);
  const json merged = read_json(r.run_dir + "/trace.json");
  std::set<int> pids;
  for (const auto& e : merged["traceEvents"]) pids.insert(e["pid"].get<int>());
  EXPECT_EQ(pids, (std::set<int>{0, 1}));

  std::vector<json> traces;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const json trace = read_json(r.run_dir + "/trace/rank-" + std::to_string(rank) + ".json");
    // Steps 2 and 3 only (run.trace_steps), each with its phases.
    std::vector<std::string> steps;
    for (const auto& e : events_named(trace, "step")) steps.push_back(e["name"]);
    EXPECT_EQ(steps, (std::vector<std::string>{"step 2", "step 3"}));
    std::multiset<std::string> phases;
    for (const auto& e : events_named(trace, "phase")) phases.insert(e["name"].get<std::string>());
    for (const char* p : {"pipeline", "grad_sync", "clip", "optimizer"}) EXPECT_EQ(phases.count(p), 2u) << p;
    EXPECT_FALSE(events_named(trace, "data").empty());  // the adapter's batches
    // Collectives carry their axis and bytes: the loss and norm all-reduce over the world.
    bool world_allreduce = false;
    for (const auto& e : events_named(trace, "comm"))
      if (e["ph"] == "b" && e["name"] == "allreduce world") world_allreduce = e["args"]["bytes"].get<double>() > 0;
    EXPECT_TRUE(world_allreduce);
    traces.push_back(trace);
  }
  const TracedPipeline traced = read_traced_pipeline(traces);
  // Within each pipeline phase: the schedule's actions, in its order.
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> want;
    for (const Action& a : schedule.actions[rank]) want.push_back(to_string(a));
    ASSERT_EQ(traced.actions[rank].size(), 2u);
    for (const auto& got : traced.actions[rank]) EXPECT_EQ(got, want) << "rank " << rank;
  }
  // The simulator's bubble for the measured costs: each rank's mean F and B
  // (the stages differ: the first has the embeddings, the last the LM head and
  // the loss) and the mean delivery time, over the two steps. Means, not
  // medians: idle time is a sum, and a few slow transfers are part of it.
  const SimCosts& costs = traced.costs;
  const SimResult sim = simulate(schedule, costs);
  ASSERT_TRUE(sim.ok) << sim.error;
  for (int rank = 0; rank < 2; ++rank) {
    const double predicted = (sim.makespan - sim.busy[rank]) / sim.makespan;
    std::printf("[ trace ] rank %d: idle %.1f%% of the pipeline phase, simulated %.1f%% (F %.2f ms, B %.2f ms, "
                "delivery %.2f ms, mean of %d messages)\n",
                rank, 100 * traced.idle_fraction[rank], 100 * predicted, costs.forward_by_rank[rank] / 1e3,
                costs.backward_by_rank[rank] / 1e3, costs.comm / 1e3, traced.deliveries);
    // Stated tolerance: 15 points. The ranks enter a step a little apart (the
    // previous step's optimizer differs per stage) and a shared 2-core machine
    // adds scheduling noise; neither is in the simulation.
    EXPECT_NEAR(traced.idle_fraction[rank], predicted, 0.15) << "rank " << rank;
  }
}

TEST(Trace, BadTraceKeysAreNamed) {
  for (const auto& [sets, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"run.trace=true", "run.trace_steps=[3, 2]"}, "run.trace_steps: expected [from, to] with 1 <= from <= to"},
           {{"run.trace_steps=[1, 2]"}, "run.trace_steps is set but neither run.trace nor run.profile_ops is true"},
           {{"run.trace_merge=true"}, "run.trace_merge is set but run.trace is not true"}}) {
    JobResult r = run_job(1, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"),
                          with(sets, {"train.steps=1"}));
    EXPECT_NE(r.exit_code, 0) << message;
    EXPECT_NE(r.output.find(message), std::string::npos) << "expected: " << message << "\n" << r.output;
  }
}

// run.profile_ops: every ATen op and autograd node of the traced steps by
// name, per step. A GPT step runs, per layer, the fused q/k/v and
// the output projection, and the MLP's two: 4 addmm per layer forward.
TEST(OpProfile, StepsOpByOp) {
  JobResult r = run_job(1, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"),
                        {"train.steps=4", "parallel.microbatches=1", "run.profile_ops=true", "run.trace_steps=[2, 3]",
                         "run.dump_parameters=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json ops = read_json(r.run_dir + "/ops/rank-0.json");
  EXPECT_EQ(ops["steps"], 2);
  std::map<std::string, json> by_name;
  for (const auto& op : ops["ops"]) by_name[op["name"]] = op;
  const int layers = 4;  // tests/integration/data/gpt-equiv.toml
  ASSERT_TRUE(by_name.count("aten::addmm")) << ops.dump();
  EXPECT_EQ(by_name["aten::addmm"]["calls"].get<double>(), 4.0 * layers) << "per step";
  ASSERT_TRUE(by_name.count("aten::layer_norm"));
  double previous = 1e300;
  for (const auto& op : ops["ops"]) {  // the largest self time first; self within total
    EXPECT_LE(op["self_us"].get<double>(), previous);
    previous = op["self_us"].get<double>();
    EXPECT_LE(op["self_us"].get<double>(), op["total_us"].get<double>() + 1e-6) << op.dump();
    EXPECT_GT(op["calls"].get<double>(), 0);
  }
}

}  // namespace
}  // namespace smp::testing
