// The train state as one object (core/src/runtime/train_state.h): enumerated,
// copied in memory and loaded into a fresh runtime of the same job, the next
// step is the one the first runtime takes, bit for bit, in layouts that slice
// it every way (tp shards, pp stages with tied weights, ZeRO 1-3 flat
// segments, fp16 masters and loss scale). Real ranks through smp-launch.
#include "integration/job_runner.h"
#include "proc_util.h"

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>
#include <torch/version.h>

#include <string>
#include <vector>

namespace {

using smp::testing::plugin_path;
using smp::testing::run_job;
using smp::testing::source_path;

// through_disk: the state goes through Checkpointer::save / Checkpointer::load in this folder.
void round_trip(int nproc, const std::vector<std::string>& overrides, const std::string& through_disk = "") {
  std::vector<std::string> launcher = {"--worker", SMP_STATE_WORKER};
  if (!through_disk.empty()) launcher.insert(launcher.end(), {"--through-disk", through_disk});
  auto r = run_job(nproc, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"),
                   smp::testing::with({"run.dump_parameters=false", "train.steps=6"}, overrides), launcher);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < nproc; ++rank)
    EXPECT_TRUE(smp_test::contains(r.output, "rank " + std::to_string(rank) + ": state round trip identical"))
        << r.output;
}

TEST(TrainStateRoundTrip, OneRank) { round_trip(1, {}); }

TEST(TrainStateRoundTrip, TensorParallelBf16) { round_trip(2, {"parallel.tp=2", "train.precision=bf16"}); }

// A loss scale of 2^20 overflows GPT-tiny's fp16 backward: the copied state
// holds a scale already halved and steps already skipped.
TEST(TrainStateRoundTrip, TensorParallelFp16) {
#if TORCH_VERSION_MAJOR < 2
  GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fp16 matrix multiply on the CPU (CI's pip torch leg runs this)";
#endif
  round_trip(2, {"parallel.tp=2", "train.precision=fp16", "train.initial_loss_scale=1048576"});
}

TEST(TrainStateRoundTrip, PipelineWithTiedWeightsBf16) {
  round_trip(2, {"parallel.pp=2", "parallel.schedule=1f1b", "train.precision=bf16"});
}

TEST(TrainStateRoundTrip, Zero1DataParallelBf16) {
  round_trip(2, {"parallel.dp=2", "parallel.zero=1", "train.precision=bf16"});
}

TEST(TrainStateRoundTrip, Zero3DataParallel) { round_trip(2, {"parallel.dp=2", "parallel.zero=3"}); }

TEST(TrainStateRoundTrip, Zero2PipelineAndDataParallelBf16) {
  round_trip(4, {"parallel.pp=2", "parallel.dp=2", "parallel.zero=2", "train.precision=bf16"});
}

// The embedding API's checkpoints: Checkpointer::save, then Checkpointer::load in a fresh runtime.
std::string fresh_folder() {
  return (boost::filesystem::temp_directory_path() / boost::filesystem::unique_path("smp-state-ckpt-%%%%-%%%%"))
      .string();
}

TEST(TrainStateRoundTrip, ThroughACheckpointOneRank) { round_trip(1, {}, fresh_folder()); }

TEST(TrainStateRoundTrip, ThroughACheckpointZero2PipelineAndDataParallelBf16) {
  round_trip(4, {"parallel.pp=2", "parallel.dp=2", "parallel.zero=2", "train.precision=bf16"}, fresh_folder());
}

}  // namespace
