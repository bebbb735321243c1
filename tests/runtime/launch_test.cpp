// smp-launch with real processes: failures, timeouts, two nodes, restarts,
// running under srun, a missing worker.
#include "proc_util.h"

#include <sched.h>

#include <gtest/gtest.h>

#include <cstdio>

#include <sys/stat.h>

namespace {

using smp_test::launch_comm_worker;

pid_t read_pid(const std::string& path) {
  std::ifstream in(path);
  long pid = -1;
  in >> pid;
  return static_cast<pid_t>(pid);
}

// A worker killed by SIGKILL mid-run: the launcher names it, stops the others
// within the kill timeout, leaves no process behind, exits non-zero.
TEST(LaunchTest, KilledRankStopsTheJob) {
  const int port = smp_test::free_port();
  const std::string pids = smp_test::temp_dir("pids");
  const std::string logs = smp_test::temp_dir("logs");
  auto child = smp_test::start(
      launch_comm_worker(3, port, {"--mode", "loop", "--pid-dir", pids, "--timeout-ms", "30000"},
             {"--kill-timeout", "3", "--log-dir", logs}));
  // Wait for every rank to be in its allreduce loop.
  std::vector<pid_t> workers(3, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < 3; ++r) {
    const std::string path = pids + "/rank-" + std::to_string(r) + ".pid";
    struct stat st;
    while (::stat(path.c_str(), &st) != 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    workers[r] = read_pid(path);
    ASSERT_GT(workers[r], 0) << "rank " << r << " never wrote its pid; output:\n"
                             << smp_test::read_file(child.out_path);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(::kill(workers[1], SIGKILL), 0);
  const auto killed_at = std::chrono::steady_clock::now();
  auto r = smp_test::wait(child, 60);
  const double after_kill = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(after_kill, 3 + 10.0) << "the launcher took too long to stop the job\n" << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "rank 1 (pid " + std::to_string(workers[1]) + ") was killed by signal SIGKILL"))
      << r.output;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(smp_test::process_gone(workers[i])) << "rank " << i << " (pid " << workers[i] << ") is still alive";
    EXPECT_TRUE(smp_test::process_gone(-workers[i])) << "rank " << i << "'s process group is still alive";
  }
  // Captured ranks' output went to the log dir.
  struct stat st;
  EXPECT_EQ(::stat((logs + "/rank-1.out").c_str(), &st), 0);
}

// Issue 54: --log-dir kept rank 1's output only (rank 0 held the terminal, not
// a file). Every rank now has its file; rank 0's output is also shown.
TEST(LaunchTest, LogDirKeepsEveryRanksOutputAndStillShowsRankZeros) {
  const int port = smp_test::free_port();
  const std::string logs = smp_test::temp_dir("logs");
  auto r = smp_test::run(launch_comm_worker(3, port, {"--mode", "check", "--timeout-ms", "30000"},
                                            {"--kill-timeout", "3", "--log-dir", logs}),
                         100);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string text = smp_test::read_file(logs + "/rank-" + std::to_string(rank) + ".out");
    EXPECT_TRUE(smp_test::contains(text, "rank " + std::to_string(rank) + ": all checks passed"))
        << "rank-" << rank << ".out:\n" << text;
  }
  EXPECT_TRUE(smp_test::contains(r.output, "rank 0: all checks passed")) << r.output;
  EXPECT_FALSE(smp_test::contains(r.output, "rank 1: all checks passed")) << r.output;  // captured, not shown
}

// A collective one rank skips: the others get an smp::Error naming the axis,
// the op and the ranks within about the timeout; the launcher exits non-zero.
TEST(LaunchTest, CollectiveTimeoutNamesAxisOpAndRanks) {
  const int port = smp_test::free_port();
  auto r = smp_test::run(launch_comm_worker(2, port, {"--mode", "timeout", "--tp", "2", "--skip-rank", "1", "--timeout-ms", "2000"},
                                {"--kill-timeout", "2"}),
                         60);
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "allreduce")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "axis 'tp'")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "world ranks [0, 1]")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "timed out")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "rank 0 (pid ")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "exited with code 3")) << r.output;
  std::printf("[ time   ] the timeout was reported after %.1f s (timeout 2 s)\n", r.seconds);
}

// Two launchers (two "nodes", one rank each) on one machine sharing the master port.
TEST(LaunchTest, TwoNodesOneMachine) {
  const int port = smp_test::free_port();
  auto node = [&](int node_rank) {
    return smp_test::start({SMP_LAUNCH_BIN, "--nnodes", "2", "--node-rank", std::to_string(node_rank),
                            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                            std::to_string(port), "--kill-timeout", "3", "--worker", SMP_COMM_WORKER, "--mode", "check",
                            "--dp", "2", "--timeout-ms", "30000"});
  };
  auto n0 = node(0);
  auto n1 = node(1);
  auto r0 = smp_test::wait(n0, 100);
  auto r1 = smp_test::wait(n1, 100);
  EXPECT_EQ(r0.exit_code, 0) << "node 0:\n" << r0.output << "\nnode 1:\n" << r1.output;
  EXPECT_EQ(r1.exit_code, 0) << "node 0:\n" << r0.output << "\nnode 1:\n" << r1.output;
  EXPECT_TRUE(smp_test::contains(r0.output, "rank 0: all checks passed")) << r0.output;
}

// --max-restarts: rank 1 fails on the first attempt only.
TEST(LaunchTest, MaxRestartsRestartsTheGroup) {
  const int port = smp_test::free_port();
  auto r = smp_test::run(launch_comm_worker(2, port, {"--mode", "fail-once", "--timeout-ms", "30000"},
                                {"--max-restarts", "1", "--kill-timeout", "3"}),
                         100);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "rank 1 (pid ")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "exited with code 5")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "failing on purpose")) << r.output;  // its last lines
  EXPECT_TRUE(smp_test::contains(r.output, "restart 1 of 1")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "rank 0: allreduce ok")) << r.output;
}

// Under srun (SLURM_PROCID/SLURM_NTASKS set): no spawning, the worker is
// exec'd directly with RANK etc. from SLURM's variables.
TEST(LaunchTest, UnderSlurmExecsTheWorkerDirectly) {
  auto r = smp_test::run(launch_comm_worker(4, 0, {"--mode", "env"}, {}), 30,
                         {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"},
                          {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_JOB_ID", "4242"}});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // --master-port 0 was given explicitly but 0 means "unset" here: derived from the job id.
  EXPECT_TRUE(smp_test::contains(r.output, "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "
                                           "MASTER_PORT=24242 SOURCE=smp-launch OMP_NUM_THREADS=1"))
      << r.output;
  // Exactly one process printed.
  EXPECT_EQ(r.output.find("SOURCE="), r.output.rfind("SOURCE=")) << r.output;
}

TEST(LaunchTest, EnvironmentOfSpawnedRanks) {
  auto r = smp_test::run(launch_comm_worker(1, 0, {"--mode", "env"}, {"--threads-per-rank", "3"}), 30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "smp-launch: MASTER_PORT=")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1"))
      << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "SOURCE=smp-launch OMP_NUM_THREADS=3")) << r.output;
}

// The launcher's options are its own wherever they stand before `--` (after
// the worker's, as the docs' commands write them); the rest, and all after
// `--`, reach the worker in order.
TEST(LaunchTest, LauncherOptionsAfterTheWorkersAreTheLaunchers) {
  auto r = smp_test::run({SMP_LAUNCH_BIN, "--worker", SMP_COMM_WORKER, "--mode", "env", "--threads-per-rank", "3",
                          "--nproc-per-node", "2", "--master-port", "0"},
                         30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "RANK=0 WORLD_SIZE=2")) << r.output;  // rank 0's output is shown
  EXPECT_TRUE(smp_test::contains(r.output, "OMP_NUM_THREADS=3")) << r.output;
  // After `--` nothing is the launcher's: the worker gets --tee and refuses it.
  auto verbatim = smp_test::run({SMP_LAUNCH_BIN, "--nproc-per-node", "1", "--master-port", "0", "--worker",
                                 SMP_COMM_WORKER, "--", "--mode", "env", "--tee"},
                                30);
  EXPECT_NE(verbatim.exit_code, 0) << verbatim.output;
  EXPECT_TRUE(smp_test::contains(verbatim.output, "--tee")) << verbatim.output;
}

// --bind-cores: each local rank gets its own core of the launcher's mask; asking
// for more cores than there are is refused before anything starts.
TEST(LaunchTest, BindCoresPinsEachRankToItsOwnCore) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  std::vector<int> cores;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  if (cores.size() < 2) GTEST_SKIP() << "needs 2 cores";
  auto r = smp_test::run(launch_comm_worker(2, 0, {"--mode", "env"}, {"--bind-cores", "--threads-per-rank", "1", "--tee"}), 30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "LOCAL_RANK=0 LOCAL_WORLD_SIZE=2")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "CPUS=" + std::to_string(cores[0]) + "\n")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "CPUS=" + std::to_string(cores[1]) + "\n")) << r.output;

  auto bad = smp_test::run(launch_comm_worker(2, 0, {"--mode", "env"}, {"--bind-cores", "--threads-per-rank", "4096"}), 30);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(smp_test::contains(bad.output, "--bind-cores: 2 ranks x 4096 cores each need 8192 cores")) << bad.output;
  EXPECT_FALSE(smp_test::contains(bad.output, "RANK=")) << bad.output;
}

TEST(LaunchTest, MissingWorkerFailsClearly) {
  auto r = smp_test::run({SMP_LAUNCH_BIN, "--nproc-per-node", "2", "--master-port", "0", "--kill-timeout", "2",
                          "--worker", "/nonexistent/smp-worker"},
                         30);
  EXPECT_EQ(r.exit_code, 127) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "cannot execute /nonexistent/smp-worker")) << r.output;
}

TEST(LaunchTest, SigtermToTheLauncherStopsEverything) {
  const int port = smp_test::free_port();
  const std::string pids = smp_test::temp_dir("pids");
  auto child = smp_test::start(launch_comm_worker(2, port, {"--mode", "loop", "--pid-dir", pids}, {"--kill-timeout", "3"}));
  std::vector<pid_t> workers(2, -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < 2; ++r) {
    const std::string path = pids + "/rank-" + std::to_string(r) + ".pid";
    struct stat st;
    while (::stat(path.c_str(), &st) != 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    workers[r] = read_pid(path);
    ASSERT_GT(workers[r], 0) << smp_test::read_file(child.out_path);
  }
  ASSERT_EQ(::kill(child.pid, SIGTERM), 0);
  auto r = smp_test::wait(child, 30);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "received SIGTERM")) << r.output;
  for (pid_t p : workers) EXPECT_TRUE(smp_test::process_gone(p)) << p;
}

}  // namespace

// Without --master-port or MASTER_PORT a single-node launch picks a free port
// (torchrun's standalone mode): two jobs started together on one machine both
// finish, each on a port of its own.
TEST(LaunchTest, TwoJobsOnOneMachineWithDefaultPortsBothFinish) {
  auto job = [] {
    return smp_test::start({SMP_LAUNCH_BIN, "--nproc-per-node", "2", "--worker", SMP_COMM_WORKER, "--mode", "loop",
                            "--steps", "200"});
  };
  const auto a = job(), b = job();
  const auto ra = smp_test::wait(a, 120), rb = smp_test::wait(b, 120);
  EXPECT_EQ(ra.exit_code, 0) << ra.output;
  EXPECT_EQ(rb.exit_code, 0) << rb.output;
  auto port_of = [](const std::string& out) {
    const auto at = out.find("smp-launch: MASTER_PORT=");
    return at == std::string::npos ? std::string() : out.substr(at + 24, out.find('\n', at) - at - 24);
  };
  EXPECT_NE(port_of(ra.output), "") << ra.output;
  EXPECT_NE(port_of(ra.output), port_of(rb.output)) << ra.output << rb.output;
}
