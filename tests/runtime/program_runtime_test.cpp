// A program driving its Runtime, through smp-launch (program_runtime_worker.cpp),
// on issue 54's smaller points: forward() splits a batch that does not divide
// by parallel.microbatches (1 rank and pp 2, equal to the plain model); a
// ZeRO-3 run prints none of LibTorch's allocator warnings; the program's
// runtime writes each rank's log file under run.log_to_file.
#include "proc_util.h"

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>

#include <regex>
#include <string>
#include <vector>

namespace {

namespace fs = boost::filesystem;

struct Job {
  smp_test::Result run;
  std::string dir;
};

Job launch(int nproc, const std::vector<std::string>& worker_args) {
  Job j;
  j.dir = smp_test::temp_dir("program-runtime");
  std::vector<std::string> argv = {SMP_LAUNCH_BIN, "--nproc-per-node", std::to_string(nproc), "--master-port",
                                   std::to_string(smp_test::free_port()), "--kill-timeout", "3", "--tee", "--worker",
                                   SMP_PROGRAM_RUNTIME_WORKER, "--dir", j.dir};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  j.run = smp_test::run(argv, 240);
  return j;
}

// "rank R forward N rows: M rows, gap G" for every rank: M == N and G tiny.
void expect_forward(const std::string& output, int ranks, int64_t rows) {
  const std::regex line("rank ([0-9]+) forward " + std::to_string(rows) + " rows: ([0-9]+) rows, gap ([^\\s]+)");
  int seen = 0;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line); it != std::sregex_iterator(); ++it) {
    ++seen;
    EXPECT_EQ(std::stoll((*it)[2]), rows) << it->str();
    EXPECT_LT(std::stod((*it)[3]), 1e-6) << it->str();
  }
  EXPECT_EQ(seen, ranks) << "forward of " << rows << " rows:\n" << output;
}

// Issue 54: forward refused 3 samples under 2 microbatches. Now a batch is cut
// like torch.tensor_split (2 + 1; 5 under 4: 2 + 1 + 1 + 1) and the outputs
// put together in order; fewer samples than microbatches is refused by name.
TEST(ProgramRuntime, ForwardSplitsABatchThatDoesNotDivideByTheMicrobatches) {
  const Job one = launch(1, {"--set", "parallel.microbatches=2", "--forward-rows", "3", "--forward-rows", "1",
                             "--steps", "1"});
  ASSERT_EQ(one.run.exit_code, 0) << one.run.output;
  expect_forward(one.run.output, 1, 3);
  EXPECT_TRUE(smp_test::contains(one.run.output, "rank 0 forward 1 rows refused: rank 0: forward: the batch's 1 "
                                                 "samples are fewer than parallel.microbatches = 2"))
      << one.run.output;
  EXPECT_TRUE(smp_test::contains(one.run.output, "rank 0 done")) << one.run.output;

  const Job four = launch(1, {"--set", "parallel.microbatches=4", "--forward-rows", "5", "--forward-rows", "7"});
  ASSERT_EQ(four.run.exit_code, 0) << four.run.output;
  expect_forward(four.run.output, 1, 5);
  expect_forward(four.run.output, 1, 7);

  // Through a pipeline: each stage gets microbatches of 2 and 1 samples.
  const Job pp = launch(2, {"--set", "parallel.pp=2", "--set", "parallel.microbatches=2", "--forward-rows", "3",
                            "--forward-rows", "5", "--steps", "1"});
  ASSERT_EQ(pp.run.exit_code, 0) << pp.run.output;
  expect_forward(pp.run.output, 2, 3);
  expect_forward(pp.run.output, 2, 5);
}

// Issue 54: LibTorch's "Memory block of unknown size was allocated before the
// profiling started" filled the output under ZeRO-3 (smp's memory tracker was
// c10's profiler hook). A ZeRO-3 run that trains and runs forward prints none.
TEST(ProgramRuntime, AZero3RunPrintsNoneOfLibTorchsAllocatorWarnings) {
  const Job j = launch(2, {"--set", "parallel.dp=2", "--set", "parallel.zero=3", "--set", "parallel.microbatches=2",
                           "--steps", "3", "--forward-rows", "4"});
  ASSERT_EQ(j.run.exit_code, 0) << j.run.output;
  EXPECT_TRUE(smp_test::contains(j.run.output, "rank 0 step 2 loss")) << j.run.output;
  EXPECT_FALSE(smp_test::contains(j.run.output, "Memory block of unknown size")) << j.run.output;
  EXPECT_FALSE(smp_test::contains(j.run.output, "CPUAllocator")) << j.run.output;
}

// Issue 54: program-driven runs wrote no log files. With run.log_to_file (the
// default) each rank writes <run.dir>/logs/rank-<r>.log, as smp-worker's do;
// run.log_to_file = false writes none.
TEST(ProgramRuntime, EachRankWritesItsLogFile) {
  const Job j = launch(2, {"--set", "parallel.dp=2", "--steps", "1"});
  ASSERT_EQ(j.run.exit_code, 0) << j.run.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string path = j.dir + "/logs/rank-" + std::to_string(rank) + ".log";
    const std::string text = smp_test::read_file(path);
    EXPECT_TRUE(smp_test::contains(text, "[rank " + std::to_string(rank) + "] [")) << path << ":\n" << text;
  }
  EXPECT_TRUE(smp_test::contains(smp_test::read_file(j.dir + "/logs/rank-0.log"), "stage 0 (rank 0"));
  const Job off = launch(2, {"--set", "parallel.dp=2", "--set", "run.log_to_file=false", "--steps", "1"});
  ASSERT_EQ(off.run.exit_code, 0) << off.run.output;
  EXPECT_FALSE(fs::exists(off.dir + "/logs")) << off.run.output;
}

}  // namespace
