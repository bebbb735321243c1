// Honest figures (issue 52, item 6): the datasheet table behind MFU (CUDA
// device names to dense peaks per dtype; a name it does not hold gets none),
// and the summary's MFU fields and report built from it: MFU against the
// datasheet peak where known, against the measured GEMM peak otherwise, and
// labelled by its basis either way. Also which GPU a rank takes.
#include "base/datasheet_peaks.h"
#include "base/device.h"
#include "trainer/run_report.h"

#include <gtest/gtest.h>

#include <string>

namespace smp {
namespace {

constexpr double T = 1e12;

TEST(DatasheetPeaks, DeviceNamesAsTheDriverReportsThemFindTheirBoard) {
  struct Case {
    const char* name;
    const char* gpu;
    double bf16;
  };
  const Case cases[] = {
      {"NVIDIA H100 80GB HBM3", "H100 SXM", 989 * T}, {"NVIDIA H100 PCIe", "H100 PCIe", 756 * T},
      {"NVIDIA H200", "H200 SXM", 989 * T},           {"NVIDIA H200 NVL", "H200 NVL", 835 * T},
      {"NVIDIA A100-SXM4-80GB", "A100", 312 * T},     {"NVIDIA A100-SXM4-40GB", "A100", 312 * T},
      {"NVIDIA A100-PCIE-40GB", "A100 PCIe", 312 * T}, {"NVIDIA A100-PCIe-40GB", "A100 PCIe", 312 * T},
      {"NVIDIA A100 80GB PCIe", "A100 PCIe", 312 * T}, {"NVIDIA B200", "B200", 2250 * T},
      {"nvidia h200", "H200 SXM", 989 * T},  // case and spacing are not the name
      {"NVIDIA  H100_PCIe ", "H100 PCIe", 756 * T},
  };
  for (const Case& c : cases) {
    const DatasheetPeak* p = datasheet_peak(c.name);
    ASSERT_NE(p, nullptr) << c.name;
    EXPECT_EQ(std::string(p->gpu), c.gpu) << c.name;
    EXPECT_EQ(p->flops("bf16"), c.bf16) << c.name;
  }
}

TEST(DatasheetPeaks, EachDtypeHasItsOwnDenseColumn) {
  const DatasheetPeak* h100 = datasheet_peak("NVIDIA H100 80GB HBM3");
  ASSERT_NE(h100, nullptr);
  EXPECT_EQ(h100->flops("bf16"), 989 * T);  // 1,979 with sparsity: the dense half
  EXPECT_EQ(h100->flops("fp16"), 989 * T);
  EXPECT_EQ(h100->flops("tf32"), 494.5 * T);
  EXPECT_EQ(h100->flops("fp32"), 67 * T);
  EXPECT_EQ(h100->flops("fp8"), 0);  // not a column smp computes in
  const DatasheetPeak* a100 = datasheet_peak("NVIDIA A100-SXM4-40GB");
  ASSERT_NE(a100, nullptr);
  EXPECT_EQ(a100->flops("tf32"), 156 * T);
  EXPECT_EQ(a100->flops("fp32"), 19.5 * T);
  const DatasheetPeak* nvl = datasheet_peak("NVIDIA H200 NVL");
  ASSERT_NE(nvl, nullptr);
  EXPECT_EQ(nvl->flops("fp32"), 60 * T);
  const DatasheetPeak* b200 = datasheet_peak("NVIDIA B200");
  ASSERT_NE(b200, nullptr);
  EXPECT_EQ(b200->flops("tf32"), 1100 * T);
  EXPECT_EQ(b200->flops("fp32"), 75 * T);
}

// Another board, a MIG slice of a known one, a name that merely starts like a
// known one, the CPU: no datasheet figure (a prefix match would give the H100
// NVL or a MIG slice the whole SXM board's peak).
TEST(DatasheetPeaks, NamesTheTableDoesNotHoldGetNone) {
  for (const char* name : {"cpu", "", "NVIDIA", "NVIDIA H100 NVL", "NVIDIA GH200 480GB", "NVIDIA H100",
                           "NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA H200 141GB HBM3e NVL", "NVIDIA B200X",
                           "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB", "AMD Instinct MI300X"})
    EXPECT_EQ(datasheet_peak(name), nullptr) << name;
}

// The H200 run of bench/results/gpu-h200.json: 524 TFLOP/s of model FLOPs on
// one H200 whose bf16 GEMM measured 782 TFLOP/s is 53% of the 989 datasheet
// peak and 67% of the measured one.
TEST(MfuFields, AgainstTheDatasheetPeakWhereKnownWithTheMeasuredBeside) {
  PeakFlops p{"NVIDIA H200", "bf16", "H200 SXM", 989 * T, 782 * T};
  nlohmann::json s;
  add_mfu_fields(s, p, 524 * T, 1);
  EXPECT_EQ(s["device_name"], "NVIDIA H200");
  EXPECT_EQ(s["peak_basis"], "datasheet H200 SXM bf16");
  EXPECT_EQ(s["peak_flops_dtype"], "bf16");
  EXPECT_EQ(s["peak_flops_datasheet_per_rank"].get<double>(), 989 * T);
  EXPECT_EQ(s["peak_flops_per_rank"].get<double>(), 782 * T);  // the measured one, as before
  EXPECT_NEAR(s["mfu"].get<double>(), 0.530, 0.001);
  EXPECT_NEAR(s["mfu_measured_peak"].get<double>(), 0.670, 0.001);
  EXPECT_EQ(mfu_peak_per_rank(s), 989 * T);

  // Over 4 ranks each peak counts 4 times.
  add_mfu_fields(s, p, 4 * 524 * T, 4);
  EXPECT_NEAR(s["mfu"].get<double>(), 0.530, 0.001);
  EXPECT_NEAR(s["mfu_measured_peak"].get<double>(), 0.670, 0.001);
}

TEST(MfuFields, WithoutADatasheetFigureTheMeasuredPeakIsTheBasisAndSaysSo) {
  PeakFlops p{"cpu", "fp32", "", 0, 50e9};
  nlohmann::json s;
  add_mfu_fields(s, p, 10e9, 2);
  EXPECT_EQ(s["peak_basis"], "measured GEMM (no datasheet figure for cpu)");
  EXPECT_TRUE(s["peak_flops_datasheet_per_rank"].is_null());
  EXPECT_DOUBLE_EQ(s["mfu"].get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(s["mfu_measured_peak"].get<double>(), 0.1);
  EXPECT_EQ(mfu_peak_per_rank(s), 50e9);
  // A summary from before the datasheet fields: its measured peak.
  EXPECT_EQ(mfu_peak_per_rank({{"peak_flops_per_rank", 7.0}}), 7.0);
  EXPECT_EQ(mfu_peak_per_rank(nlohmann::json::object()), 0.0);
}

// The report's MFU chart and table are against the summary's basis, the
// datasheet's where it has one: a step at 524 TFLOP/s on one H200 is drawn at
// 53%, and the table states both figures with their bases.
TEST(MfuFields, TheReportDrawsMfuAgainstTheSummarysBasis) {
  nlohmann::json s = {{"losses", {2.0, 1.0}},
                      {"step_seconds_each", {1.0, 1.0}},
                      {"items_per_step", 1.0},
                      {"model_flops_per_step", 524 * T},
                      {"layout", {{"world", 1}}},
                      {"throughput_unit", "tokens"}};
  add_mfu_fields(s, PeakFlops{"NVIDIA H200", "bf16", "H200 SXM", 989 * T, 782 * T}, 524 * T, 1);
  const std::string html = render_report(s);
  EXPECT_NE(html.find("MFU per step (%, against the datasheet H200 SXM bf16 peak)"), std::string::npos);
  EXPECT_NE(html.find("53.0%"), std::string::npos) << "the table's MFU against the datasheet";
  EXPECT_NE(html.find("67.0% of 782TFLOP/s per rank"), std::string::npos) << "the measured basis beside it";
  EXPECT_NE(html.find("NVIDIA H200"), std::string::npos);
  // The chart's y axis spans the datasheet MFU (53%: ticks 52 and 54), not the
  // measured one (67%: 66 and 68).
  const std::string chart = html.substr(html.find("MFU per step"));
  EXPECT_NE(chart.find(">54</text>"), std::string::npos);
  EXPECT_EQ(chart.find(">68</text>"), std::string::npos);
}

}  // namespace
}  // namespace smp

namespace smp {
namespace {

// Which GPU a rank takes (base/device.h): local rank, run.devices, or the one
// GPU a scheduler gave the task.
TEST(DeviceChoice, LocalRankRunDevicesOrTheTasksOwnGpu) {
  std::string why;
  EXPECT_EQ(cuda_index_for(3, {}, 8, nullptr, &why), 3);
  EXPECT_EQ(cuda_index_for(1, {0, 0}, 1, nullptr, &why), 0);  // two ranks sharing a GPU, as asked
  // srun --gpus-per-task=1: each task sees its own GPU as cuda:0.
  EXPECT_EQ(cuda_index_for(3, {}, 1, "GPU-5e3c1a2b", &why), 0);
  EXPECT_EQ(cuda_index_for(1, {}, 1, "2", &why), 0);
  // One GPU and nothing saying it is this task's own: refused, naming the way to share.
  EXPECT_EQ(cuda_index_for(1, {}, 1, nullptr, &why), -1);
  EXPECT_NE(why.find("it would use cuda:1, but it sees 1 GPU(s); several ranks can share one with run.devices"),
            std::string::npos)
      << why;
  EXPECT_EQ(cuda_index_for(2, {}, 2, "0,1", &why), -1);
  EXPECT_NE(why.find("(CUDA_VISIBLE_DEVICES=0,1)"), std::string::npos) << why;
  EXPECT_EQ(cuda_index_for(2, {0, 1}, 2, nullptr, &why), -1);
  EXPECT_NE(why.find("run.devices has 2 entries, but it needs entry 2"), std::string::npos) << why;
  EXPECT_EQ(cuda_index_for(0, {4}, 2, nullptr, &why), -1);
  EXPECT_NE(why.find("cuda:4, but it sees 2 GPU(s) (run.devices)"), std::string::npos) << why;
}

}  // namespace
}  // namespace smp
