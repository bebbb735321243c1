// ProcessEnv from the launcher variables, and logging's per-rank files.
#include <smp/error.h>
#include <smp/logging.h>
#include <smp/process_env.h>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "proc_util.h"

#include <cstdlib>

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

}  // namespace
