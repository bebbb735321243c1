// The communicator on CUDA tensors, with real processes: two ranks share GPU 0
// (the one-GPU machine of scripts/gpu/check.sh), so every collective and the
// pipeline's sends go through host memory (NCCL refuses two ranks on one GPU).
// Skips without CUDA. The checks live in comm_worker.cpp (--mode cuda).
#include "proc_util.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

namespace {

TEST(CommCuda, EveryCollectiveOnCudaTensorsOfRanksSharingOneGpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA here (a CPU-only LibTorch, or no GPU on this machine)";
  auto r = smp_test::run(smp_test::launch_comm_worker(2, smp_test::free_port(), {"--mode", "cuda", "--timeout-ms", "60000"},
                                                      {"--kill-timeout", "5"}),
                         /*timeout_s=*/100);
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "rank 0: cuda checks passed (")) << r.output;
  EXPECT_TRUE(smp_test::contains(r.output, "through host memory")) << r.output;
}

}  // namespace
