// GPT jobs on a GPU, for a machine with ONE GPU (scripts/gpu/check.sh runs these,
// label "cuda"): two ranks share it (run.devices = [0, 0]), so their CUDA tensors
// cross between ranks through host memory and Gloo (NCCL refuses two ranks on one
// GPU; comm.cuda_backend = "nccl" then says so). Each layout must equal the serial
// CUDA run; bf16 on the GPU must track fp32 on the CPU. Without CUDA every test
// skips, naming why.
#include "job_runner.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace smp::testing {
namespace {

std::string gpt_config() { return source_path("tests/integration/data/gpt-equiv.toml"); }

#define SKIP_WITHOUT_GPU()                                                                              \
  do {                                                                                                  \
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA here (a CPU-only LibTorch, or no GPU on this machine)"; \
  } while (0)

const std::vector<std::string> kCuda = {"run.device=\"cuda\""};
const std::vector<std::string> kShared = {"run.device=\"cuda\"", "run.devices=[0, 0]"};

// Over the steps of both; they must have run as many.
double worst_loss_difference(const JobResult& a, const JobResult& b) {
  EXPECT_EQ(losses_of(a).size(), losses_of(b).size());
  return worst_relative(losses_of(a), losses_of(b));
}

double worst_param_difference(const JobResult& a, const JobResult& b) {
  std::string problem;
  auto pa = assemble_parameters(a.run_dir, 1e-6, &problem);
  EXPECT_TRUE(problem.empty()) << problem;
  auto pb = assemble_parameters(b.run_dir, 0, &problem);
  EXPECT_EQ(pa.size(), pb.size());
  double worst = 0;
  for (const auto& [name, t] : pb)
    if (pa.count(name)) worst = std::max(worst, (pa[name] - t).abs().max().item<double>());
  return worst;
}

TEST(CudaJobs, GptPipeline2OnOneSharedGpuEqualsSerial) {
  SKIP_WITHOUT_GPU();
  JobResult serial = run_job(1, plugin_path("gpt"), gpt_config(), kCuda);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  EXPECT_EQ(serial.summary["device"], "cuda:0");
  JobResult pp2 = run_job(2, plugin_path("gpt"), gpt_config(), with(kShared, {"parallel.pp=2"}));
  ASSERT_EQ(pp2.exit_code, 0) << pp2.output;
  EXPECT_LE(worst_loss_difference(pp2, serial), 2e-5);
  EXPECT_LE(worst_param_difference(pp2, serial), 2e-4);
}

// The memory manager on the GPU: ZeRO-3 (parameters gathered and freed around
// each module on CUDA storage) with checkpointed layers and the attention core
// recomputed, on two ranks sharing the GPU, against the serial CUDA run; the
// account reports the CUDA allocator's peak.
TEST(CudaJobs, ShardedAndCheckpointedOnOneSharedGpuEqualsSerial) {
  SKIP_WITHOUT_GPU();
  JobResult serial = run_job(1, plugin_path("gpt"), gpt_config(), kCuda);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  JobResult z3 = run_job(2, plugin_path("gpt"), gpt_config(),
                         with(kShared, {"parallel.dp=2", "parallel.zero=3", "memory.checkpoint=[\"blocks.0\"]",
                                        "memory.checkpoint_attention_core=[\"blocks\"]"}));
  ASSERT_EQ(z3.exit_code, 0) << z3.output;
  EXPECT_LE(worst_loss_difference(z3, serial), 2e-5);
  EXPECT_LE(worst_param_difference(z3, serial), 2e-4);
  EXPECT_GT(z3.summary["memory_bytes"]["step_peak"][0].get<double>(), 0);
}

// Activation offload: the checkpointed layers' inputs wait in pinned host
// memory and come back ahead of backward. Only copies: the run must equal the
// same run without offload bit for bit, serial and pp 2 (1F1B, horizon 1, so
// some loads are prefetched and the first is not).
TEST(CudaJobs, OffloadedActivationsEqualKeptOnes) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::string> ckpt = {"memory.checkpoint=[\"blocks\"]"};
  for (int pp : {1, 2}) {
    std::vector<std::string> base = with(pp == 1 ? kCuda : kShared, ckpt);
    if (pp == 2) base = with(base, {"parallel.pp=2", "parallel.microbatches=4"});
    JobResult kept = run_job(pp, plugin_path("gpt"), gpt_config(), base);
    ASSERT_EQ(kept.exit_code, 0) << kept.output;
    JobResult off = run_job(pp, plugin_path("gpt"), gpt_config(),
                            with(base, {"memory.offload=true", "memory.offload_horizon=1"}));
    ASSERT_EQ(off.exit_code, 0) << off.output;
    EXPECT_EQ(losses_of(off), losses_of(kept)) << "pp " << pp;
    EXPECT_EQ(worst_param_difference(off, kept), 0) << "pp " << pp;
    EXPECT_GT(off.summary["memory_bytes"]["offloaded_host"][0].get<double>(), 0) << off.output;
    EXPECT_EQ(kept.summary["memory_bytes"]["offloaded_host"][0].get<double>(), 0);
  }
  JobResult bare = run_job(1, plugin_path("gpt"), gpt_config(), with(kCuda, {"memory.offload=true"}));
  EXPECT_NE(bare.exit_code, 0);
  EXPECT_NE(bare.output.find("memory.offload = true offloads the inputs that checkpointed nodes keep"),
            std::string::npos)
      << bare.output;
}

TEST(CudaJobs, GptDataParallelOnOneSharedGpuGoesThroughHostMemory) {
  SKIP_WITHOUT_GPU();
  JobResult serial = run_job(1, plugin_path("gpt"), gpt_config(), kCuda);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  JobResult dp2 = run_job(2, plugin_path("gpt"), gpt_config(), with(kShared, {"parallel.dp=2"}));
  ASSERT_EQ(dp2.exit_code, 0) << dp2.output;
  EXPECT_NE(dp2.output.find("CUDA tensors go through host memory"), std::string::npos) << dp2.output;
  EXPECT_LE(worst_loss_difference(dp2, serial), 2e-5);
  EXPECT_LE(worst_param_difference(dp2, serial), 2e-4);
}

TEST(CudaJobs, NcclBackendOnASharedGpuIsRefusedClearly) {
  SKIP_WITHOUT_GPU();
  JobResult r = run_job(2, plugin_path("gpt"), gpt_config(),
                        with(kShared, {"parallel.dp=2", "comm.cuda_backend=\"nccl\""}));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("comm.cuda_backend = \"nccl\""), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("NCCL needs one GPU per rank"), std::string::npos) << r.output;
}

TEST(CudaJobs, Bf16OnTheGpuTracksFp32OnTheCpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::string> longer = {"train.steps=20", "train.lr=3e-3", "run.dump_parameters=false"};
  JobResult cpu = run_job(1, plugin_path("gpt"), gpt_config(), with(longer, {"run.device=\"cpu\""}));
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  JobResult gpu = run_job(1, plugin_path("gpt"), gpt_config(), with(with(longer, kCuda), {"train.precision=\"bf16\""}));
  ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
  const double worst = worst_loss_difference(gpu, cpu);
  std::printf("[ cuda bf16 ] worst relative loss difference vs cpu fp32 %.2e\n", worst);
  EXPECT_LE(worst, 1e-2);  // as Precision.Bf16TracksFp32OnGptTiny
}

TEST(CudaJobs, Fp16WithLossScalingTrainsOnTheGpu) {
  SKIP_WITHOUT_GPU();
  JobResult r = run_job(1, plugin_path("gpt"), gpt_config(),
                        with(kCuda, {"train.steps=30", "train.lr=3e-3", "train.precision=\"fp16\"",
                                     "train.initial_loss_scale=1048576.0", "run.dump_parameters=false"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GE(r.summary["skipped_steps"].get<int64_t>(), 1);
  auto l = r.summary["losses"].get<std::vector<double>>();
  EXPECT_LT(l.back(), l.front() - 0.5);
}

}  // namespace
}  // namespace smp::testing
