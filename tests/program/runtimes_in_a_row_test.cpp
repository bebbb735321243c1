// Three runtimes created and destroyed in a row in one process, on two real
// ranks under smp-launch (runtimes_in_a_row_worker.cpp), at pp 2 and at dp 2
// (issue 54). Every runtime of a process joins the same launcher's rendezvous
// (one master port): a second one used to fail now and then, connecting to the
// first one's store or reading its stale keys. The failure was intermittent,
// so each layout is launched several times.
#include "proc_util.h"

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>

#include <string>
#include <vector>

namespace {

namespace fs = boost::filesystem;


struct Job {
  int exit_code = -1;
  std::string output;
  std::vector<std::string> ranks;  // what each rank wrote: a line per runtime
};

Job launch(const std::vector<std::string>& worker_args) {
  Job r;
  const std::string dir = (fs::temp_directory_path() / fs::unique_path("smp-in-a-row-%%%%-%%%%")).string();
  fs::create_directories(dir);
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<std::string> args = {"--out", dir};
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    const smp_test::Result launched = smp_test::smp_launch(2, SMP_RUNTIMES_IN_A_ROW_WORKER, args);
    r.output = launched.output;
    r.exit_code = launched.exit_code;
    // Only the first runtime's store may meet a port another program took
    // after free_port() looked (a race of the test's, not of smp's).
    const bool port_taken = smp_test::contains(r.output, "runtime 0: error") &&
                            smp_test::contains(r.output, "Address already in use");
    if (r.exit_code == 0 || !port_taken) break;
    for (int rank = 0; rank < 2; ++rank) fs::remove(dir + "/rank-" + std::to_string(rank) + ".txt");
  }
  for (int rank = 0; rank < 2; ++rank)
    r.ranks.push_back(smp_test::read_file(dir + "/rank-" + std::to_string(rank) + ".txt"));
  fs::remove_all(dir);
  return r;
}

// Launches the layout `times` times; each launch must run its three runtimes
// on both ranks with the first runtime's losses.
void expect_runtimes_in_a_row(const std::vector<std::string>& overrides, int times) {
  std::vector<std::string> args = {"--runtimes", "3", "--steps", "2"};
  for (const auto& o : overrides) args.insert(args.end(), {"--set", o});
  for (int i = 0; i < times; ++i) {
    const Job j = launch(args);
    ASSERT_EQ(j.exit_code, 0) << "launch " << i + 1 << " of " << times << ":\n" << j.output;
    for (int rank = 0; rank < 2; ++rank)
      for (int k = 0; k < 3; ++k)
        EXPECT_TRUE(smp_test::contains(j.ranks[rank], "rank " + std::to_string(rank) + " runtime " +
                                                          std::to_string(k) + " losses "))
            << "rank " << rank << ", runtime " << k << ", launch " << i + 1 << ":\n"
            << j.ranks[rank] << j.output;
  }
}

// Measured before the fix (issue 54), on 2 shared cores: 14 of 21 launches
// failed at pp 2 and 9 of 21 at dp 2, so five launches of each miss the bug
// with probability < 0.01 and < 0.07 (both together < 0.001). About 2.5 s a launch.
constexpr int kLaunches = 5;

TEST(RuntimesInARow, ThreeRuntimesInOneProcessAtPipelineOfTwo) {
  expect_runtimes_in_a_row({"parallel.pp=2", "parallel.microbatches=2"}, kLaunches);
}

TEST(RuntimesInARow, ThreeRuntimesInOneProcessAtDataParallelOfTwo) {
  expect_runtimes_in_a_row({"parallel.dp=2"}, kLaunches);
}

}  // namespace
