// Bad jobs fail with a clear message naming the key, node, plugin or rank, a
// non-zero exit, and without destroying what an earlier run wrote.
#include "job_runner.h"

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>

#include <fstream>

#include <unistd.h>

namespace smp::testing {
namespace {

std::string gpt_config() { return source_path("tests/integration/data/gpt-equiv.toml"); }

void expect_failure(const JobResult& r, const std::vector<std::string>& needles) {
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (const auto& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << "missing '" << n << "' in:\n" << r.output;
}

TEST(JobErrors, UnknownModelKeyNamesIt) {
  expect_failure(run_job(1, plugin_path("gpt"), gpt_config(), {"model.layerz=3"}), {"model.layerz", "unknown key"});
}

TEST(JobErrors, BadModelValueNamesKey) {
  expect_failure(run_job(1, plugin_path("gpt"), gpt_config(), {"model.layers=-2"}), {"model.layers", "positive"});
}

TEST(JobErrors, MissingDataFileNamesIt) {
  expect_failure(run_job(1, plugin_path("gpt"), gpt_config(), {"model.data=/nonexistent/corpus.txt"}),
                 {"model.data", "/nonexistent/corpus.txt"});
}

TEST(JobErrors, TensorParallelDegreeThatDoesNotDivideNamesNodeAndSizes) {
  // 4 heads do not split 3 ways (the vocabulary does: GPT pads it to 384, a
  // multiple of 128 x 3); the first such node in order is named.
  expect_failure(run_job(3, plugin_path("gpt"), gpt_config(), {"parallel.tp=3", "train.batch_size=12"}),
                 {"parallel.tp = 3", "node 'blocks.0'", "heads 4 not divisible by tp 3", "rule from plugin 'smp_tp'"});
}

// A job's own axis that no loaded plugin has a rule for would only repeat work:
// refused by name. A placement naming an axis the job did not declare too.
TEST(JobErrors, AJobAxisWithoutARuleOrUndeclaredIsRefusedByName) {
  expect_failure(run_job(2, plugin_path("gpt"), gpt_config(), {"parallel.axes.xp=2"}),
                 {"parallel.axes.xp = 2", "no loaded plugin has a \"xp\" rule"});
  expect_failure(run_job(2, plugin_path("gpt"), gpt_config(), {"parallel.placement=\"pp,xp,dp,tp\""}),
                 {"parallel.placement names \"xp\"", "parallel.axes"});
}

// Context parallelism's bad layouts, refused before any step by the key that
// makes them: a sequence that does not cut into 2 cp chunks, heads the
// all-to-all form cannot split, dropout on attention across the ring, an
// adapter that does not cut its sequences, cp declared as a model axis, and
// an unknown form.
TEST(JobErrors, BadContextParallelLayoutsAreRefusedByKey) {
  expect_failure(run_job(4, plugin_path("gpt"), gpt_config(), {"parallel.cp=4", "model.seq_len=12"}),
                 {"model.seq_len = 12", "2 x parallel.cp = 8"});
  expect_failure(run_job(4, plugin_path("gpt"), gpt_config(),
                         {"parallel.cp=4", "parallel.cp_mode=\"alltoall\"", "model.arch=llama", "model.kv_heads=2",
                          "model.ffn=48"}),
                 {"parallel.cp_mode = \"alltoall\"", "4 heads and 2 kv heads"});
  expect_failure(run_job(2, plugin_path("gpt"), gpt_config(), {"parallel.cp=2", "model.dropout=0.1"}),
                 {"parallel.cp = 2", "dropout 0.1", "node 'blocks.0'"});
  expect_failure(run_job(2, plugin_path("moe"), source_path("tests/integration/data/moe-equiv.toml"), {"parallel.cp=2"}),
                 {"parallel.cp = 2: adapter 'moe' (plugin 'moe')", "does not cut its samples' sequences"});
  expect_failure(run_job(2, plugin_path("gpt"), gpt_config(), {"parallel.axes.cp=2"}),
                 {"parallel.axes.cp", "\"cp\" is the sequence axis, set by parallel.cp"});
  expect_failure(run_job(2, plugin_path("gpt"), gpt_config(), {"parallel.cp=2", "parallel.cp_mode=\"ulysses\""}),
                 {"parallel.cp_mode", "\"ring\", \"alltoall\""});
}

// Plugin-owned tables (ABI 2.5's SMP_EXTENSION_CONFIG): the owner checks its
// table and names the key; a table no loaded plugin declares is refused by
// name; the key that moved to smp_tp's table says where it went.
TEST(JobErrors, APluginTableIsCheckedByItsOwnerAndAnUnownedOneIsRefused) {
  expect_failure(run_job(1, plugin_path("gpt"), gpt_config(), {"tp.sequence_parallel=1"}),
                 {"[tp] (plugin 'smp_tp')", "tp.sequence_parallel: expected a boolean", "got 1"});
  expect_failure(run_job(1, plugin_path("gpt"), gpt_config(), {"tp.sequence_paralel=true"}),
                 {"[tp] (plugin 'smp_tp')", "unknown key 'tp.sequence_paralel'"});
  JobResult r = run_job(1, plugin_path("gpt"), gpt_config(), {"trian.steps=3"});
  expect_failure(r, {"unknown table [trian] (did you mean [train]?)", "[tp] of smp_tp"});
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "it trained before failing:\n" << r.output;
  expect_failure(run_job(1, plugin_path("gpt"), gpt_config(), {"parallel.sequence_parallel=true"}),
                 {"unknown key 'parallel.sequence_parallel': it moved to tp.sequence_parallel"});
}

TEST(JobErrors, MorePipelineStagesThanNodesIsAnError) {
  expect_failure(run_job(2, plugin_path("gpt"), gpt_config(),
                         {"parallel.pp=2", "parallel.virtual_stages=8", "parallel.schedule=interleaved-1f1b",
                          "parallel.microbatches=4"}),
                 {"stage"});
}

TEST(JobErrors, UnknownPartitionerNamesKnownOnes) {
  expect_failure(run_job(2, plugin_path("gpt"), gpt_config(), {"parallel.pp=2", "parallel.partition=magic"}),
                 {"parallel.partition", "magic", "balanced"});
}

TEST(JobErrors, UnknownPartitionOptionIsRefusedByNameEvenWithOneStage) {
  expect_failure(run_job(2, plugin_path("gpt"), gpt_config(), {"parallel.pp=2", "partition.optimise=speed"}),
                 {"partition.optimise", "not an option of the 'balanced' partition strategy", "memory_weight"});
  // pp = 1 partitions nothing, but the key is still refused rather than ignored.
  expect_failure(run_job(1, plugin_path("gpt"), gpt_config(), {"partition.memory_wieght=0.5"}),
                 {"partition.memory_wieght", "not an option"});
  expect_failure(run_job(2, plugin_path("gpt"), gpt_config(),
                         {"parallel.pp=2", "parallel.partition=manual", "partition.memory_weight=0.5",
                          "partition.manual={ \"wte\" = 0, \"wpe\" = 0, \"blocks\" = 1, \"ln_f\" = 1, \"lm_head\" = 1, \"loss\" = 1 }"}),
                 {"partition.memory_weight", "'manual'"});
}

TEST(JobErrors, UnwritableRunDirNamesTheKeyBeforeTraining) {
  JobResult r = run_job(1, plugin_path("gpt"), gpt_config(), {"run.dir=/proc/smp-cannot-write-here"});
  expect_failure(r, {"run.dir", "/proc/smp-cannot-write-here"});
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << "it trained before failing:\n" << r.output;
}

TEST(JobErrors, MissingAdapterPluginNamesFile) {
  expect_failure(run_job(1, "/nonexistent/model.so", gpt_config(), {}), {"/nonexistent/model.so"});
}

TEST(JobErrors, FailedRunKeepsPreviousSummary) {
  JobResult ok = run_job(1, plugin_path("gpt"), gpt_config(), {"train.steps=1"});
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  ASSERT_TRUE(boost::filesystem::exists(ok.run_dir + "/summary.json"));
  std::ifstream before(ok.run_dir + "/summary.json");
  std::string content((std::istreambuf_iterator<char>(before)), std::istreambuf_iterator<char>());
  // Same run.dir, a config that fails while building the runtime.
  JobResult bad = run_job(1, plugin_path("gpt"), gpt_config(), {"model.heads=5", "run.dir=" + ok.run_dir});
  EXPECT_NE(bad.exit_code, 0);
  std::ifstream after(ok.run_dir + "/summary.json");
  std::string content_after((std::istreambuf_iterator<char>(after)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, content_after);
}

// A rank killed between creating its shared-memory segment and unlinking it
// leaves /dev/shm/smp-<pid>-<n> behind; a later rank that gets the same pid
// must take another name, not fail with EEXIST. Leftovers for the next 300
// pids stand in for those of killed runs (the job's ranks start right after).
TEST(JobErrors, LeftoverSharedMemoryNamesOfAKilledRunAreSkipped) {
  std::vector<std::string> stale;
  for (pid_t p = getpid(); p < getpid() + 300; ++p)
    for (int n = 0; n < 3; ++n) {
      const std::string path = "/dev/shm/smp-" + std::to_string(p) + "-" + std::to_string(n);
      if (!boost::filesystem::exists(path)) {
        std::ofstream(path).flush();
        stale.push_back(path);
      }
    }
  const JobResult r = run_job(2, plugin_path("gpt"), gpt_config(), {"parallel.dp=2", "train.steps=2"});
  for (const auto& path : stale) boost::filesystem::remove(path);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace smp::testing
