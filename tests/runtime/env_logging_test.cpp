// ProcessEnv from the launcher variables, and logging's per-rank files.
#include <smp/error.h>
#include <smp/logging.h>
#include <smp/process_env.h>

#include <gtest/gtest.h>
#include <spdlog/sinks/null_sink.h>
#include <spdlog/spdlog.h>

#include "base/runtime_logging.h"
#include "proc_util.h"

#include <cstdlib>
#include <iostream>

namespace {

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& k : smp_test::launcher_vars()) ::unsetenv(k.c_str());
  }
  void TearDown() override { SetUp(); }
  static void set(const char* k, const char* v) { ::setenv(k, v, 1); }
};

TEST_F(EnvTest, SmpLaunch) {
  set("RANK", "3"), set("WORLD_SIZE", "4"), set("LOCAL_RANK", "1"), set("LOCAL_WORLD_SIZE", "2");
  set("MASTER_ADDR", "10.0.0.1"), set("MASTER_PORT", "1234"), set("SMP_LAUNCHED", "1");
  auto e = smp::ProcessEnv::from_environment();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.0.0.1");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_EQ(e.source, "smp-launch");
  ::unsetenv("SMP_LAUNCHED");
  EXPECT_EQ(smp::ProcessEnv::from_environment().source, "env");
}

TEST_F(EnvTest, Slurm) {
  set("SLURM_PROCID", "5"), set("SLURM_NTASKS", "8"), set("SLURM_LOCALID", "1"), set("SLURM_TASKS_PER_NODE", "4(x2)");
  set("SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"), set("SLURM_JOB_ID", "777");
  auto e = smp::ProcessEnv::from_environment();
  EXPECT_EQ(e.source, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.master_port, 20777);
  set("MASTER_ADDR", "node0"), set("MASTER_PORT", "4000");
  e = smp::ProcessEnv::from_environment();
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 4000);
}

TEST_F(EnvTest, OpenMpi) {
  set("OMPI_COMM_WORLD_RANK", "2"), set("OMPI_COMM_WORLD_SIZE", "4"), set("OMPI_COMM_WORLD_LOCAL_RANK", "2");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  auto e = smp::ProcessEnv::from_environment();
  EXPECT_EQ(e.source, "mpi");
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");  // two nodes, no MASTER_ADDR
  EXPECT_THROW(smp::ProcessEnv::from_environment(), smp::Error);
}

TEST_F(EnvTest, SingleProcess) {
  auto e = smp::ProcessEnv::from_environment();
  EXPECT_EQ(e.source, "single");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_GT(e.master_port, 0);
}

TEST_F(EnvTest, BadValuesNameTheVariable) {
  set("RANK", "x"), set("WORLD_SIZE", "2");
  try {
    smp::ProcessEnv::from_environment();
    FAIL() << "no error";
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=\"x\""), std::string::npos) << e.what();
  }
  set("RANK", "2");
  try {
    smp::ProcessEnv::from_environment();
    FAIL() << "no error";
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("RANK=2 is not below WORLD_SIZE=2"), std::string::npos) << e.what();
  }
}

TEST(LoggingTest, PerRankFileWithRankTagAndReinit) {
  const std::string dir = smp_test::temp_dir("log");
  smp::logging::init(3, 4, dir, true, false);
  spdlog::info("hello {}", 42);
  spdlog::debug("details");
  const std::string path = smp::logging::log_file_path(dir, 3);
  EXPECT_EQ(path, dir + "/logs/rank-3.log");
  // Re-init (tests, restarts) replaces the logger; the file is appended.
  smp::logging::init(3, 4, dir, true, true);
  spdlog::warn("second");
  spdlog::default_logger()->flush();
  std::string text = smp_test::read_file(path);
  EXPECT_NE(text.find("] [rank 3] [info] hello 42"), std::string::npos) << text;
  EXPECT_NE(text.find("[rank 3] [debug] details"), std::string::npos) << text;
  EXPECT_NE(text.find("[rank 3] [warning] second"), std::string::npos) << text;
  // No file when asked not to.
  smp::logging::init(1, 4, dir, false, false);
  spdlog::info("not in a file");
  EXPECT_TRUE(smp_test::read_file(smp::logging::log_file_path(dir, 1)).empty());
  smp::logging::init(0, 1, "", true, true);
  spdlog::info("console only");
}

// Issue 54: a runtime the program drives logs per rank as smp-worker's do.
// init_for_runtime replaces spdlog's stock logger only: not a logger init()
// set up (smp-worker's), nor the program's own; a runtime with another folder
// sets it up again. Run in a fresh process (what was set up is process-wide).
TEST(LoggingTest, ARuntimeSetsUpLoggingUnlessTheProcessHasItsOwn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto check = [] {
    bool ok = true;
    auto expect = [&](bool c, const std::string& what) {
      if (!c) std::cerr << "FAILED: " << what << std::endl, ok = false;
    };
    const std::string a = smp_test::temp_dir("log-a"), b = smp_test::temp_dir("log-b"),
                      c = smp_test::temp_dir("log-c"), d = smp_test::temp_dir("log-d");
    namespace lg = smp::logging;
    expect(spdlog::default_logger()->name().empty(), "spdlog's stock logger at first");
    lg::init_for_runtime(1, 2, a, true);
    spdlog::info("runtime a");
    spdlog::default_logger()->flush();
    expect(smp_test::contains(smp_test::read_file(a + "/logs/rank-1.log"), "[rank 1] [info] runtime a"),
           "rank 1's file under folder a");
    const auto first = spdlog::default_logger();
    lg::init_for_runtime(1, 2, a, true);
    expect(spdlog::default_logger() == first, "the same runtime again keeps the logger");
    lg::init_for_runtime(1, 2, b, true);
    spdlog::info("runtime b");
    spdlog::default_logger()->flush();
    expect(smp_test::contains(smp_test::read_file(b + "/logs/rank-1.log"), "runtime b"), "a second folder");
    // The program's own logger stays.
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("program", std::make_shared<spdlog::sinks::null_sink_mt>()));
    lg::init_for_runtime(0, 1, c, true);
    expect(spdlog::default_logger()->name() == "program", "the program's logger is kept");
    expect(smp_test::read_file(c + "/logs/rank-0.log").empty(), "no file beside the program's logger");
    // smp::logging::init's (smp-worker's) stays.
    lg::init(0, 1, "", false, true);
    const auto worker = spdlog::default_logger();
    lg::init_for_runtime(0, 1, d, true);
    expect(spdlog::default_logger() == worker, "init()'s logger is kept");
    expect(smp_test::read_file(d + "/logs/rank-0.log").empty(), "no file beside init()'s logger");
    std::cerr << (ok ? "all as expected" : "not as expected") << std::endl;
    std::exit(ok ? 0 : 1);
  };
  EXPECT_EXIT(check(), ::testing::ExitedWithCode(0), "all as expected");
}

}  // namespace
