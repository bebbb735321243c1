// The planner: cluster files refused naming the key; the step-time model
// against Megatron-LM's published runs (Table 1 of Narayanan et al. 2021) on
// the DGX A100 preset, one preset and one model for every row; the search
// proposes only layouts that fit and is deterministic; a program plans in
// process as smp-plan does.
#include "plan/search.h"

#include <smp/plan.h>

#include <smp/error.h>

#include <boost/filesystem.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <sys/stat.h>
#include <sys/wait.h>

#include <dlfcn.h>

#include <cstdlib>

namespace {

namespace fs = boost::filesystem;
using namespace smp::plan;

std::string preset(const std::string& name) { return std::string(SMP_SOURCE_DIR) + "/configs/clusters/" + name + ".toml"; }

std::string read(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The preset's text with `from` replaced by `to`, written to a fresh file.
std::string edited(const std::string& from, const std::string& to) {
  std::string text = read(preset("dgx-a100-80gb"));
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  const fs::path path = fs::temp_directory_path() / fs::unique_path("smp-cluster-%%%%-%%%%.toml");
  std::ofstream(path.string()) << text;
  return path.string();
}

std::string refusal(const std::string& path) {
  try {
    read_cluster(path);
  } catch (const smp::Error& e) {
    return e.what();
  }
  return "(accepted)";
}

Shape megatron(int64_t layers, int64_t hidden, int64_t heads, int64_t batch) {
  Shape s;
  s.layers = layers, s.hidden = hidden, s.heads = heads, s.seq = 2048, s.vocab = 51200, s.batch = batch;
  return s;
}

TEST(Plan, EveryShippedPresetReads) {
  for (const char* name : {"dgx-a100-80gb", "dgx-h100", "dgx-h200"}) {
    SCOPED_TRACE(name);
    const Cluster c = load_cluster(name);
    EXPECT_EQ(c.name, name);
    EXPECT_EQ(c.node_size, 8);
    EXPECT_GT(c.peak("bf16"), 3e14);
  }
}

// A missing, mistyped or contradictory key is refused naming the file and the key.
TEST(Plan, ClusterFilesWithAMissingOrContradictoryKeyAreRefusedNamingIt) {
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{"memory_gb = 80\n", ""}, "accelerator.memory_gb: missing"},
      {{"memory_gb = 80", "memory_gb = -80"}, "accelerator.memory_gb: must be a positive number"},
      {{"memory_gb = 80", "memory_gb = \"eighty\""}, "accelerator.memory_gb: must be a positive number"},
      {{"[512, 0.6]", "[4096, 0.6]"}, "accelerator.gemm_efficiency[3]: sizes must rise from one pair to the next"},
      {{"[8192, 0.78]", "[8192, 1.5]"}, "accelerator.gemm_efficiency[5]: the fraction of peak must lie in (0, 1]"},
      {{"bandwidth_gbs = 22", "bandwidth_gbs = 900"},
       "links.inter.bandwidth_gbs: is above links.intra.bandwidth_gbs"},
      {{"accelerators = 8", "accelerators = 7.5"}, "node.accelerators: must be a whole number"},
      {{"inside_node = [\"tp\", \"pp\", \"dp\"]", "inside_node = [\"tp\", \"tp\"]"},
       "topology.inside_node: names \"tp\" twice"},
      {{"inside_node = [\"tp\", \"pp\", \"dp\"]", "inside_node = [\"tp\", \"cp\"]"},
       "topology.inside_node: an entry is not one of"},
      {{"latency_us = 5", "latency_us = 5\nlatancy_us = 3"}, "links.intra.latancy_us: unknown key"},
      {{"fp32 = 19.5", "fp32 = 19.5, fp8 = 624"}, "accelerator.peak_tflops.fp8: unknown dtype"},
      {{"memory_bandwidth_gbs = 2039", "memory_bandwidth_gbs = 2039\nelementwise_gbs = 3000"},
       "accelerator.elementwise_gbs: is above accelerator.memory_bandwidth_gbs"},
      {{"memory_bandwidth_gbs = 2039", "memory_bandwidth_gbs = 2039\nop_overhead_us = -1"},
       "accelerator.op_overhead_us: must be a number >= 0"},
      {{"[topology]", "[links.alltoall]\nbandwidth_gbs = 100\n\n[topology]"}, "links.alltoall.latency_us: missing"},
      {{"[topology]", "[links.allgather]\nbandwidth_gbs = 100\n\n[topology]"}, "links.allgather: unknown key"},
  };
  for (const auto& [edit, message] : cases) {
    const std::string path = edited(edit.first, edit.second);
    const std::string said = refusal(path);
    EXPECT_NE(said.find(path + ": " + message), std::string::npos) << "expected: " << message << "\ngot: " << said;
    fs::remove(path);
  }
  EXPECT_NE(refusal("/nonexistent/cluster.toml").find("/nonexistent/cluster.toml"), std::string::npos);
}

// Megatron-LM's Table 1 (GPT, vocabulary 51,200, sequence 2048, fp16, DGX A100
// 80 GB, interleaved where pp > 1): the predicted TFLOP/s per GPU with the
// paper's FLOP count (equation 3, recomputation counted) within 15% of the
// published figure for every row, with one preset and one model; the
// microbatch size and the virtual stages are the search's, as the paper tuned
// them. bench/configs/plan-published.json holds the rows; smp-plan --validate
// writes bench/results/plan-published.json from them.
TEST(Plan, MegatronsPublishedRunsArePredictedWithin15Percent) {
  std::ifstream in(std::string(SMP_SOURCE_DIR) + "/bench/configs/plan-published.json");
  const nlohmann::json published = nlohmann::json::parse(in);
  const Cluster c = load_cluster("dgx-a100-80gb");
  ASSERT_EQ(published["rows"].size(), 5u);
  for (const auto& row : published["rows"]) {
    SCOPED_TRACE(row["params"].get<std::string>());
    Shape s = megatron(row["layers"], row["hidden"], row["heads"], row["batch"]);
    SearchOptions o;
    o.world = row["gpus"], o.tp = row["tp"], o.pp = row["pp"];
    o.zero_stages = {0};
    o.recompute = {true};
    o.overlap_dp = false;  // Megatron-LM then reduced the gradients after the backward
    o.schedules = {"1f1b"};  // and interleaved (more than one virtual stage), as the paper ran
    const SearchResult r = search(c, s, o);
    ASSERT_FALSE(r.ranked.empty());
    const double predicted = r.ranked.front().prediction.tflops_per_device, reported = row["tflops_per_gpu"];
    std::printf("[ plan ] %s: published %.0f, predicted %.1f TFLOP/s per GPU (%+.1f%%), %s\n",
                row["params"].get<std::string>().c_str(), reported, predicted, 100 * (predicted / reported - 1),
                r.ranked.front().layout.describe().c_str());
    EXPECT_LE(std::fabs(predicted / reported - 1), 0.15);
  }
}

// The model's FLOPs are the paper's equation 3 for ffn = 4h.
TEST(Plan, FlopsAreThePapersEquation) {
  const Shape s = megatron(24, 2304, 24, 512);
  Layout l;
  l.dp = 32;
  const Prediction p = predict(load_cluster("dgx-a100-80gb"), s, l);
  const double B = 512, S = 2048, L = 24, h = 2304, V = 51200;
  EXPECT_NEAR(p.flops / (96 * B * S * L * h * h * (1 + S / (6 * h) + V / (16 * L * h))), 1.0, 1e-12);
  l.recompute = false;
  EXPECT_NEAR(predict(load_cluster("dgx-a100-80gb"), s, l).flops /
                  (72 * B * S * L * h * h * (1 + S / (6 * h) + V / (12 * L * h))),
              1.0, 1e-12);
}

// Every proposed layout fits the accelerator's memory; on a smaller one some
// layouts are left out (the filter does something) and none proposed exceeds it.
TEST(Plan, NoProposedLayoutExceedsTheMemory) {
  Cluster c = load_cluster("dgx-a100-80gb");
  const Shape s = megatron(48, 8192, 64, 1536);
  SearchOptions o;
  o.world = 512;
  const SearchResult roomy = search(c, s, o);
  c.memory_bytes = 24e9;
  const SearchResult tight = search(c, s, o);
  EXPECT_EQ(roomy.candidates, tight.candidates);
  EXPECT_LT(tight.fitting, roomy.fitting);
  EXPECT_GT(tight.fitting, 0);
  for (const auto& k : tight.ranked) EXPECT_LE(k.prediction.memory_bytes, 24e9) << k.layout.describe();
  for (size_t i = 1; i < tight.ranked.size(); ++i)
    EXPECT_LE(tight.ranked[i - 1].prediction.step_seconds, tight.ranked[i].prediction.step_seconds);
}

// Context parallelism: a long sequence's activations per rank fall with cp
// (its tokens' share, attention blocks [s/cp, s/cp], plus the ring's
// buffers), the FLOPs stay the model's, the ring's exposed hops and the
// gradients' sum over cp are their own term; and a sequence that fits no
// layout without cp is planned with it.
TEST(Plan, ContextParallelSplitsASequencesActivations) {
  const Cluster c = load_cluster("dgx-h100");
  Shape s = megatron(32, 4096, 32, 8);
  s.seq = 65536, s.vocab = 32000, s.kv_heads = 8;
  Layout one;
  one.tp = 8, one.recompute = true;
  Layout four = one;
  four.cp = 4;
  EXPECT_EQ(invalid(s, four, 32), "");
  EXPECT_NE(invalid(s, four, 8), "");  // tp x cp is not the world
  const Prediction p1 = predict(c, s, one), p4 = predict(c, s, four);
  EXPECT_EQ(p1.cp_comm, 0);
  EXPECT_GT(p4.cp_comm, 0);
  EXPECT_NEAR(p4.model_flops / p1.model_flops, 1.0, 1e-12);
  // Activations: the memory less that of a 16-token sequence (parameters,
  // gradients and optimizer state, but for the position table's rows).
  const auto activations = [&](const Prediction& p, const Layout& l) {
    Shape tiny = s;
    tiny.seq = 16;
    return p.memory_bytes - predict(c, tiny, l).memory_bytes;
  };
  const double a1 = activations(p1, one), a4 = activations(p4, four);
  EXPECT_LT(a4, a1 / 4 * 1.1) << a1 << " " << a4;
  EXPECT_GT(a4, a1 / 4 * 0.5) << a1 << " " << a4;
  Shape odd = s;
  odd.seq = 65536 + 4;
  EXPECT_NE(invalid(odd, four, 32), "");
  SearchOptions o;
  o.world = 32;
  o.max_cp = 1;
  Cluster small = c;
  small.memory_bytes = 40e9;
  const SearchResult without = search(small, s, o);
  o.max_cp = 0;
  const SearchResult with = search(small, s, o);
  EXPECT_GT(with.candidates, without.candidates);
  ASSERT_FALSE(with.ranked.empty());
  EXPECT_GT(with.ranked.front().layout.cp, 1) << with.ranked.front().layout.describe();
  for (const auto& k : without.ranked) EXPECT_EQ(k.layout.cp, 1);
}

TEST(Plan, TheSearchIsDeterministic) {
  const Cluster c = load_cluster("dgx-h100");
  const Shape s = megatron(80, 12288, 96, 2304);
  SearchOptions o;
  o.world = 1536;
  const SearchResult a = search(c, s, o), b = search(c, s, o);
  ASSERT_EQ(a.ranked.size(), b.ranked.size());
  ASSERT_FALSE(a.ranked.empty());
  for (size_t i = 0; i < a.ranked.size(); ++i) {
    EXPECT_EQ(a.ranked[i].layout.describe(), b.ranked[i].layout.describe());
    EXPECT_EQ(a.ranked[i].prediction.step_seconds, b.ranked[i].prediction.step_seconds);
  }
}

std::string run_command(const std::string& command, int* code = nullptr) {
  std::string out;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  char buf[4096];
  while (pipe && fgets(buf, sizeof buf, pipe)) out += buf;
  const int status = pipe ? pclose(pipe) : -1;
  if (code) *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return out;
}

// smp-launch --plan, and parallel.layout = "auto" in a job, run the layout
// the planner picks for the job: the same one smp-plan lists first, which the
// ranks then report; a job that sets a key the plan chooses is refused naming
// it, and so is "auto" without a cluster, or without smp-launch.
TEST(Plan, SmpLaunchPlanRunsTheLayoutThePlannerPicks) {
  const fs::path cluster = fs::temp_directory_path() / fs::unique_path("smp-cluster-%%%%-%%%%.toml");
  std::string text = read(preset("dgx-a100-80gb"));
  text.replace(text.find("memory_gb = 80"), 14, "memory_gb = 0.00092");
  std::ofstream(cluster.string()) << text;
  const std::string job = std::string(SMP_SOURCE_DIR) + "/tests/integration/data/gpt-equiv.toml";
  const std::string planned = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --cluster " + cluster.string() +
                                          " --world 2 --config " + job + " --top 1 --json");
  const std::string layout = nlohmann::json::parse(planned.substr(planned.find("{\n")))["top"][0]["layout"];
  const std::string dir = (fs::temp_directory_path() / fs::unique_path("smp-plan-run-%%%%-%%%%")).string();
  const std::string launch = std::string(SMP_BIN_DIR) + "/smp-launch --nproc-per-node 2 --plan " + cluster.string() +
                             " --plugin gpt --config " + job + " --set train.steps=1 --set 'run.dir=\"" + dir + "\"'";
  int code = -1;
  std::string out = run_command(launch, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("--plan " + cluster.string() + ": " + layout + ", predicted"), std::string::npos) << out;
  EXPECT_NE(out.find("layout pp=1 tp=1 dp=2 world=2"), std::string::npos) << out;  // the plan's pick: dp 2, ZeRO 1
  out = run_command(launch + " --set parallel.zero=3", &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--plan " + cluster.string() +
                     ": the plan chooses parallel.zero, which the job sets (--set parallel.zero=3)"),
            std::string::npos)
      << out;
  fs::remove_all(dir);
  // parallel.layout = "auto" with parallel.cluster in the job file: the same
  // plan, run by smp-launch; the run records "planned".
  std::string text_job = read(job);
  text_job.replace(text_job.find("microbatches = 4"), 16,
                   "layout = \"auto\"\ncluster = \"" + cluster.string() + "\"");
  const fs::path auto_job = fs::temp_directory_path() / fs::unique_path("smp-auto-job-%%%%-%%%%.toml");
  std::ofstream(auto_job.string()) << text_job;
  const std::string base = std::string(SMP_BIN_DIR) + "/smp-launch --nproc-per-node 2 --plugin gpt --config ";
  const std::string run_dir = " --set train.steps=1 --set 'run.dir=\"" + dir + "\"'";
  out = run_command(base + auto_job.string() + run_dir, &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("parallel.layout = \"auto\" for " + cluster.string() + ": " + layout + ", predicted"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("layout pp=1 tp=1 dp=2 world=2"), std::string::npos) << out;
  EXPECT_EQ(nlohmann::json::parse(read(dir + "/summary.json"))["config"]["parallel"]["layout"], "planned");
  // A process started without smp-launch cannot plan: refused naming the key.
  out = run_command(std::string(SMP_BIN_DIR) + "/smp-worker --estimate-memory --world-size 2 --plugin gpt --config " +
                    auto_job.string(), &code);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find(auto_job.string() + ": parallel.layout = \"auto\" is resolved by smp-launch"), std::string::npos)
      << out;
  // "auto" with a key the plan sets in the job file, or without a cluster: refused naming them.
  out = run_command(base + job + " --set 'parallel.layout=\"auto\"' --set 'parallel.cluster=\"" + cluster.string() +
                    "\"'" + run_dir, &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find(job + ": parallel.microbatches: set by the job while parallel.layout = \"auto\" leaves it to "
                           "the plan"),
            std::string::npos)
      << out;
  out = run_command(base + job + " --set 'parallel.layout=\"auto\"'" + run_dir, &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--set parallel.layout=\"auto\": parallel.layout = \"auto\" needs parallel.cluster"),
            std::string::npos)
      << out;
  fs::remove(auto_job);
  fs::remove(cluster);
  fs::remove_all(dir);
}

// smp-plan --calibrate writes a cluster file of this machine that the planner
// reads back: the measured figures in range (a GEMM curve rising to 1 at the
// fastest size, links with a bandwidth and a latency), and a plan made with it.
TEST(Plan, CalibrateWritesThisMachinesClusterFile) {
  const std::string path = (fs::temp_directory_path() / fs::unique_path("smp-this-machine-%%%%.toml")).string();
  int code = -1;
  const std::string out = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --calibrate " + path, &code);
  ASSERT_EQ(code, 0) << out;
  const Cluster c = read_cluster(path);
  EXPECT_EQ(c.name, "this-machine");
  EXPECT_GT(c.peak("fp32"), 1e9);
  EXPECT_GT(c.peak("bf16"), 0);
  EXPECT_GT(c.memory_bandwidth, 1e8);
  double best = 0;
  for (const auto& [size, fraction] : c.gemm_efficiency) best = std::max(best, fraction);
  EXPECT_EQ(best, 1.0);
  EXPECT_GT(c.intra.bandwidth, 0);
  EXPECT_GT(c.intra.latency, 0);
  EXPECT_GT(c.inter.latency, 0);
  EXPECT_LE(c.inter.bandwidth, c.intra.bandwidth);
  const std::string planned = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --cluster " + path +
                                          " --world 2 --config " + SMP_SOURCE_DIR +
                                          "/tests/integration/data/gpt-equiv.toml --top 3 --json", &code);
  EXPECT_EQ(code, 0) << planned;
  fs::remove(path);
}

// smp-plan --config: the shape from the job, and every layout listed has
// passed smp's own memory estimate, whose figure it shows: the top layout's
// memory is what smp-launch --estimate-memory prints for it, none listed
// exceeds the accelerator's memory, and the estimate left some out.
TEST(Plan, AJobsLayoutsCarrySmpsOwnMemoryEstimate) {
  const fs::path cluster = fs::temp_directory_path() / fs::unique_path("smp-cluster-%%%%-%%%%.toml");
  std::string text = read(preset("dgx-a100-80gb"));
  text.replace(text.find("memory_gb = 80"), 14, "memory_gb = 0.00092");  // the gpt-equiv job at dp 2 needs about that
  std::ofstream(cluster.string()) << text;
  const std::string job = std::string(SMP_SOURCE_DIR) + "/tests/integration/data/gpt-equiv.toml";
  const auto run = [](const std::string& command) { return run_command(command); };
  const std::string planned = run(std::string(SMP_BIN_DIR) + "/smp-plan --cluster " + cluster.string() +
                                  " --world 2 --config " + job + " --top 50 --json");
  const nlohmann::json plan = nlohmann::json::parse(planned.substr(planned.find("{\n")));
  EXPECT_EQ(plan["memory"], "smp's estimate");
  ASSERT_FALSE(plan["top"].empty()) << planned;
  EXPECT_GT(plan["left_out_by_smps_estimate"].get<int>(), 0) << "the estimate left nothing out: the test sees little";
  for (const auto& k : plan["top"]) EXPECT_LE(k["memory_bytes"].get<double>(), 0.00092e9) << k["layout"];
  std::string estimate = std::string(SMP_BIN_DIR) + "/smp-launch --nproc-per-node 2 --estimate-memory --plugin gpt "
                         "--config " + job;
  for (const auto& set : plan["top"][0]["sets"]) estimate += " --set '" + set.get<std::string>() + "'";
  const std::string printed = run(estimate);
  const size_t at = printed.rfind("{\"layout\"");
  ASSERT_NE(at, std::string::npos) << printed;
  EXPECT_EQ(nlohmann::json::parse(printed.substr(at))["max_total_bytes"].get<double>(),
            plan["top"][0]["memory_bytes"].get<double>())
      << plan["top"][0]["layout"];
  fs::remove(cluster);
  // A preset's shape, resolved by the adapter: GPT-3 175B (its vocabulary padded to 51200 for tp 8).
  const std::string gpt3 = run(std::string(SMP_BIN_DIR) + "/smp-plan --cluster dgx-a100-80gb --world 1024 --config " +
                               std::string(SMP_SOURCE_DIR) + "/configs/gpt3-175b-1024.toml --top 1 --json");
  const nlohmann::json shape = nlohmann::json::parse(gpt3.substr(gpt3.find("{\n")))["shape"];
  EXPECT_EQ(shape, nlohmann::json({{"layers", 96}, {"hidden", 12288}, {"heads", 96}, {"seq", 2048}, {"vocab", 51200},
                                   {"ffn", 49152}, {"kv_heads", 96}, {"gated_mlp", false}, {"moe_layers", 0},
                                   {"experts", 0}, {"top_k", 0}, {"expert_ffn", 0}, {"shared_experts", 0},
                                   {"batch", 1536}, {"dtype", "bf16"}}))
      << gpt3;
}

// A MoE job's shape as the moe adapter builds it (grouped-query attention,
// experts, top-k), and expert parallelism among the layouts: ep 2 costs its
// all-to-alls, which a faster all-to-all link makes cheaper, and halves the
// expert parameters each rank keeps; its --set lines carry parallel.ep.
TEST(Plan, MoeJobsAreSearchedOverExpertParallelism) {
  const std::string job = std::string(SMP_SOURCE_DIR) + "/bench/configs/moe-bench.toml";
  const std::string out = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --cluster dgx-a100-80gb --world 2 --plugin "
                                      "moe --config " + job + " --top 1000 --json");
  const nlohmann::json plan = nlohmann::json::parse(out.substr(out.find("{\n")));
  const nlohmann::json& shape = plan["shape"];
  EXPECT_EQ(shape["layers"], 4);
  EXPECT_EQ(shape["moe_layers"], 4);
  EXPECT_EQ(shape["experts"], 16);
  EXPECT_EQ(shape["top_k"], 4);
  EXPECT_EQ(shape["expert_ffn"], 128);
  EXPECT_EQ(shape["kv_heads"], 2);
  int ep2 = 0;
  for (const auto& k : plan["top"]) {
    const std::vector<std::string> sets = k["sets"];
    const bool expert_parallel = k["layout"].get<std::string>().find(" ep 2 ") != std::string::npos;
    EXPECT_NE(std::find(sets.begin(), sets.end(), expert_parallel ? "parallel.ep=2" : "parallel.ep=1"), sets.end())
        << k["layout"];
    EXPECT_EQ(k["terms_seconds"]["ep"].get<double>() > 0, expert_parallel) << k["layout"];
    ep2 += expert_parallel;
  }
  EXPECT_GT(ep2, 0) << out;
  Shape s;
  s.layers = 4, s.hidden = 128, s.heads = 4, s.kv_heads = 2, s.seq = 128, s.vocab = 256, s.batch = 16, s.dtype = "fp32";
  s.moe_layers = 4, s.experts = 16, s.top_k = 4, s.expert_ffn = 128, s.gated_mlp = true;
  Cluster c = load_cluster("dgx-a100-80gb");
  Layout one, two;
  one.dp = two.dp = 2, two.ep = 2;
  const Prediction p1 = predict(c, s, one), p2 = predict(c, s, two);
  EXPECT_EQ(p1.ep_comm, 0);
  EXPECT_GT(p2.ep_comm, 0);
  EXPECT_LT(p2.memory_bytes, p1.memory_bytes);
  c.alltoall = {c.intra.bandwidth * 10, 0}, c.has_alltoall = true;
  EXPECT_LT(predict(c, s, two).ep_comm, p2.ep_comm);
  EXPECT_NE(invalid(s, [] { Layout l; l.dp = 2, l.ep = 4; return l; }(), 2), "");
}

// Issue 51: every figure of a cluster file is range-checked where the planner
// uses it: NaN or infinite GEMM efficiencies made every prediction NaN (and a
// layout was still printed), a node of 1e10 accelerators overflowed the int
// to zero candidates ("no layout fits 80 GB", the wrong reason), 1e300 GB of
// memory became infinite bytes. Each is refused naming the file and the key.
TEST(Plan, ClusterFiguresOutOfRangeAreRefusedNamingTheKey) {
  const std::vector<std::pair<std::pair<std::string, std::string>, std::string>> cases = {
      {{"[64, 0.25]", "[nan, 0.25]"}, "accelerator.gemm_efficiency[0]: the size must be a number in [1, 1e+09], got nan"},
      {{"[64, 0.25]", "[64, nan]"}, "accelerator.gemm_efficiency[0]: the fraction of peak must lie in (0, 1]"},
      {{"[64, 0.25]", "[64, 1e-300]"}, "accelerator.gemm_efficiency[0]: the fraction of peak must lie in (0, 1]"},
      {{"[8192, 0.78]", "[inf, 0.78]"}, "accelerator.gemm_efficiency[5]: the size must be a number in [1, 1e+09]"},
      {{"[8192, 0.78]", "[1e300, 0.78]"}, "accelerator.gemm_efficiency[5]: the size must be a number in [1, 1e+09]"},
      {{"memory_gb = 80", "memory_gb = 1e300"}, "accelerator.memory_gb: must be a positive number (at most 1e+06), got 1e+300"},
      {{"memory_gb = 80", "memory_gb = inf"}, "accelerator.memory_gb: must be a positive number"},
      {{"fp16 = 312.0", "fp16 = nan"}, "accelerator.peak_tflops.fp16: must be a positive number"},
      {{"fp16 = 312.0", "fp16 = 1e300"}, "accelerator.peak_tflops.fp16: must be a positive number (at least 1e-06, at most 1e+06)"},
      {{"fp16 = 312.0", "fp16 = 1e-300"}, "accelerator.peak_tflops.fp16: must be a positive number (at least 1e-06"},
      {{"latency_us = 5", "latency_us = 1e300"}, "links.intra.latency_us: must be a number >= 0 (at most 1e+06)"},
      {{"bandwidth_gbs = 230", "bandwidth_gbs = 1e300"}, "links.intra.bandwidth_gbs: must be a positive number"},
      {{"accelerators = 8", "accelerators = 1e10"}, "node.accelerators: must be a positive number (at most 4096), got 1e+10"},
      {{"accelerators = 8", "accelerators = 2147483648"}, "node.accelerators: must be a positive number (at most 4096)"},
  };
  for (const auto& [edit, message] : cases) {
    const std::string path = edited(edit.first, edit.second);
    const std::string said = refusal(path);
    EXPECT_NE(said.find(path + ": " + message), std::string::npos) << "expected: " << message << "\ngot: " << said;
    fs::remove(path);
  }
}

// A cluster file nested past the bound crashed toml++ (stack overflow); a
// named pipe blocked smp-plan forever. Both refused naming the file, before
// toml++ parses anything.
TEST(Plan, DeepOrPipedClusterFilesAreRefusedNamingTheFile) {
  std::string deep_header = "[a", deep_key = "a", deep_inline = "x = ";
  for (int i = 0; i < 100000; ++i) deep_header += ".a", deep_key += ".a", deep_inline += "{a = ";
  for (const std::string& deep : {deep_header + "]\n", deep_key + " = 1\n", deep_inline + "1\n"}) {
    const std::string path = edited("[topology]", deep + "[topology]");
    EXPECT_NE(refusal(path).find(path + ":"), std::string::npos) << refusal(path).substr(0, 300);
    EXPECT_NE(refusal(path).find("nested deeper than 32 levels"), std::string::npos) << refusal(path).substr(0, 300);
    fs::remove(path);
  }
  const fs::path dir = fs::temp_directory_path() / fs::unique_path("smp-cluster-fifo-%%%%-%%%%");
  fs::create_directories(dir);
  const std::string fifo = (dir / "cluster.toml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  int code = 0;
  // Under `timeout`: an smp-plan that waits on the pipe fails here (124), not the suite.
  const std::string out = run_command("timeout 30 " + std::string(SMP_BIN_DIR) + "/smp-plan --cluster " + fifo +
                                          " --world 8 --layers 2 --hidden 64 --heads 2 --seq 64 --vocab 100 --batch 8",
                                      &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find(fifo + " is a named pipe, not a regular file"), std::string::npos) << out;
  fs::remove_all(dir);
}

// smp-plan --world 2147483647 died of SIGFPE (divisors() overflowed its int
// counter); a world beyond what a job may have is refused naming the option,
// and a node of 1e10 accelerators is refused for what it is, not as "no layout fits".
TEST(Plan, SmpPlanRefusesAWorldOrNodeItCannotSearchNamingIt) {
  const std::string shape = " --layers 2 --hidden 64 --heads 2 --seq 64 --vocab 100 --batch 8";
  int code = 0;
  std::string out = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --cluster dgx-a100-80gb --world 2147483647" + shape, &code);
  EXPECT_NE(code, 0) << out;
  EXPECT_LT(code, 128) << "ended by a signal:\n" << out;
  EXPECT_NE(out.find("--world"), std::string::npos) << out;
  EXPECT_NE(out.find("1048576"), std::string::npos) << out;
  out = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --cluster dgx-a100-80gb --world 1048576" + shape, &code);
  EXPECT_TRUE(code == 0 || code == 2) << out;  // the largest world is searched (no layout of 8 samples fits it)
  // No layout at all (tp 3 divides neither 64 ranks nor 2 heads) is not "no layout fits 80 GB".
  out = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --cluster dgx-a100-80gb --world 64 --tp 3" + shape, &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("no layout of 64 ranks exists"), std::string::npos) << out;
  EXPECT_EQ(out.find("no layout fits"), std::string::npos) << out;
  // A hidden size the heads do not divide (a head size of 0 was ranked).
  out = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --cluster dgx-a100-80gb --world 8 --layers 2 --hidden 16 "
                    "--heads 2048 --seq 64 --vocab 100 --batch 8", &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("--hidden 16 is not a multiple of --heads 2048"), std::string::npos) << out;
  const std::string node = edited("accelerators = 8", "accelerators = 1e10");
  out = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --cluster " + node + " --world 8" + shape, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find(node + ": node.accelerators: must be a positive number (at most 4096)"), std::string::npos) << out;
  EXPECT_EQ(out.find("no layout fits"), std::string::npos) << out;
  fs::remove(node);
  const std::string nan = edited("[64, 0.25]", "[64, nan]");
  out = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --cluster " + nan + " --world 8" + shape, &code);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find(nan + ": accelerator.gemm_efficiency[0]"), std::string::npos) << out;
  EXPECT_EQ(out.find("the best, to run it"), std::string::npos) << out;
  fs::remove(nan);
}

// smp-plan --config started through PATH (argv[0] a bare name) found no
// plugins: the plugin folder is found from the executable itself.
TEST(Plan, SmpPlanStartedThroughPathFindsThePlugins) {
  const std::string job = std::string(SMP_SOURCE_DIR) + "/tests/integration/data/gpt-equiv.toml";
  int code = 0;
  const std::string out = run_command("cd / && PATH='" + std::string(SMP_BIN_DIR) +
                                          "':\"$PATH\" smp-plan --cluster dgx-a100-80gb --world 2 --top 1 --config " +
                                          job,
                                      &code);
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.find("not found"), std::string::npos) << out;
  EXPECT_NE(out.find("the best, to run it"), std::string::npos) << out;
}

// smp-launch: --nproc-per-node 1000000 --nnodes 1000000 overflowed the int
// world size. Each option is bounded, and their product (in int64_t), naming them.
// A job file that is a named pipe or nests past the bound is refused before
// a rank starts (smp-launch reads it for parallel.layout = "auto").
TEST(Plan, SmpLaunchRefusesMoreRanksThanAJobMayHaveNamingTheOptions) {
  // --estimate-memory with /bin/echo as the worker: one process that prints
  // the world size it was given, so that a regression shows the overflow
  // here instead of starting a million ranks.
  const std::string launch = "timeout 60 " + std::string(SMP_BIN_DIR) + "/smp-launch --estimate-memory --worker /bin/echo ";
  int code = 0;
  std::string out = run_command(launch + "--nproc-per-node 1000000 --nnodes 1000000", &code);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("--nproc-per-node"), std::string::npos) << out;
  out = run_command(launch + "--nproc-per-node 4096 --nnodes 1000000", &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--nproc-per-node 4096 x --nnodes 1000000 = 4096000000 ranks, more than the 1048576"),
            std::string::npos) << out;
  out = run_command(launch + "--nproc-per-node 2 --nnodes 524288", &code);
  EXPECT_EQ(code, 0) << out;  // the largest world a job may have
  EXPECT_NE(out.find("--world-size 1048576"), std::string::npos) << out;
  out = run_command(launch + "--nnodes 4294967297", &code);
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("--nnodes"), std::string::npos) << out;
  // Found from outside: NaN passed CLI11's range check, and a regular file
  // as --log-dir left the ranks' logs nowhere without a word.
  out = run_command(launch + "--kill-timeout nan", &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--kill-timeout"), std::string::npos) << out;
  out = run_command(launch + "--log-dir /etc/passwd", &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--log-dir /etc/passwd exists and is not a folder"), std::string::npos) << out;

  const fs::path dir = fs::temp_directory_path() / fs::unique_path("smp-launch-input-%%%%-%%%%");
  fs::create_directories(dir);
  const std::string fifo = (dir / "job.toml").string(), deep = (dir / "deep.toml").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  out = run_command("timeout 30 " + std::string(SMP_BIN_DIR) + "/smp-launch --nproc-per-node 2 --plugin gpt --config " +
                        fifo,
                    &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find(fifo + " is a named pipe, not a regular file"), std::string::npos) << out;
  {
    std::ofstream f(deep);
    f << "[parallel]\nlayout = \"auto\"\ncluster = \"dgx-a100-80gb\"\n[model]\nx = ";
    for (int i = 0; i < 100000; ++i) f << "[";
    f << "\n";
  }
  out = run_command("timeout 60 " + std::string(SMP_BIN_DIR) + "/smp-launch --nproc-per-node 2 --plugin gpt --config " + deep, &code);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find(deep + ":5: nested deeper than 32 levels"), std::string::npos) << out;
  fs::remove_all(dir);
}

// The planner in process (<smp/plan.h>): a program that embeds it gets what
// smp-plan --config --json prints, through the C++ API and through the C door
// of the library smp-launch loads (libsmp_plan_job.so; smp-launch starts no
// smp-plan), and its errors name the cluster file and key, the job's key, or
// why no layout fits, as smp-plan's do.
nlohmann::json timeless(nlohmann::json plan) {  // what a plan says that does not depend on the clock
  plan.erase("search_seconds");
  return plan;
}

TEST(PlanInProcess, AnEmbeddedPlanIsSmpPlans) {
  const std::string cluster = edited("memory_gb = 80", "memory_gb = 0.00092");
  const std::string job = std::string(SMP_SOURCE_DIR) + "/tests/integration/data/gpt-equiv.toml";
  const std::string printed = run_command(std::string(SMP_BIN_DIR) + "/smp-plan --cluster " + cluster +
                                          " --world 2 --config " + job + " --top 3 --json");
  ASSERT_NE(printed.find("{\n"), std::string::npos) << printed;
  const nlohmann::json expected = timeless(nlohmann::json::parse(printed.substr(printed.find("{\n"))));
  ASSERT_FALSE(expected["top"].empty()) << printed;

  JobRequest r;
  r.cluster = cluster, r.world = 2, r.config = job, r.top = 3;
  EXPECT_EQ(timeless(plan_job(r)), expected);

  void* lib = dlopen((std::string(SMP_BUILD_DIR) + "/" + SMP_LIBDIR + "/smp/libsmp_plan_job.so").c_str(),
                     RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  const auto entry = reinterpret_cast<char* (*)(const char*, int*)>(dlsym(lib, "smp_plan_job_json"));
  ASSERT_NE(entry, nullptr);
  int ok = 0;
  char* answer = entry(nlohmann::json({{"cluster", cluster}, {"world", 2}, {"config", job}, {"top", 3}}).dump().c_str(),
                       &ok);
  ASSERT_NE(answer, nullptr);
  const std::string text = answer;
  std::free(answer);
  ASSERT_EQ(ok, 1) << text;
  EXPECT_EQ(timeless(nlohmann::json::parse(text)), expected);
  fs::remove(cluster);
}

std::string plan_refusal(const JobRequest& r) {
  try {
    plan_job(r);
  } catch (const smp::Error& e) {
    return e.what();
  }
  return "(planned)";
}

TEST(PlanInProcess, ErrorsNameTheClusterFileTheJobOrWhyNothingFits) {
  const std::string bad = edited("memory_gb = 80\n", "");
  JobRequest r;
  r.cluster = bad, r.world = 2, r.config = std::string(SMP_SOURCE_DIR) + "/tests/integration/data/gpt-equiv.toml";
  std::string e = plan_refusal(r);
  EXPECT_NE(e.find(bad + ": accelerator.memory_gb: missing"), std::string::npos) << e;
  fs::remove(bad);

  r.cluster = "dgx-a100-80gb";
  r.sets = {"train.batch_size=\"many\""};
  e = plan_refusal(r);
  EXPECT_NE(e.find("train.batch_size"), std::string::npos) << e;

  const std::string tiny = edited("memory_gb = 80", "memory_gb = 0.000001");
  r.cluster = tiny, r.sets = {};
  e = plan_refusal(r);
  EXPECT_NE(e.find("no layout fits 1e-06 GB per accelerator"), std::string::npos) << e;
  fs::remove(tiny);

  r.cluster = "dgx-a100-80gb", r.world = 0;
  e = plan_refusal(r);
  EXPECT_NE(e.find("world 0: expected 1 to"), std::string::npos) << e;
}

}  // namespace
