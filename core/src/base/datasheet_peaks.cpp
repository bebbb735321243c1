#include "base/datasheet_peaks.h"

#include <cctype>
#include <iterator>

namespace smp {

namespace {

constexpr double T = 1e12;

// NVIDIA's datasheets print the tensor-core rates with 2:4 sparsity ("* With
// sparsity"; dense is half): the figures below are the dense halves, per GPU.
//
// A100 (SXM4 and PCIe, 40 and 80 GB alike): BF16/FP16 312, TF32 156, FP32 19.5
//   TFLOP/s. NVIDIA A100 datasheet, nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
//   (www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/), as
//   tabulated at glennklockwood.com/garden/processors/A100.
// H100 SXM / PCIe: BF16/FP16 1,979 / 1,513 sparse, TF32 989 / 756 sparse, FP32
//   67 / 51. NVIDIA H100 datasheet (resources.nvidia.com, "NVIDIA H100 Tensor
//   Core GPU"), its table reproduced at archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html
//   ("Shown with sparsity. Specifications 1/2 lower without sparsity").
// H200 SXM: the H100 SXM's compute (same GH100 at the same clocks; 989 dense
//   BF16, itkb.uw.cz "NVIDIA H200 vs B300", 2026). H200 NVL: BF16/FP16 1,671
//   sparse, TF32 835 sparse, FP32 60 (www.nvidia.com/en-us/data-center/h200/;
//   the NVL column was not found in the reference search, so it rests on that
//   page alone).
// B200 (HGX B200, per GPU at 1,000 W): FP16/BF16 4.5 PFLOP/s sparse, TF32 2.2
//   sparse, FP32 75 TFLOP/s. NVIDIA's HGX/DGX B200 specification table
//   (www.nvidia.com/en-us/data-center/hgx/), reproduced at
//   zdszero.github.io/Computer/Artificial_Intelligence/Hardware.html; dense
//   2.25 PFLOP/s BF16 also at glennklockwood.com/garden/processors/B200.
//
// The same figures back smp-plan's presets (configs/clusters/dgx-*.toml).
constexpr DatasheetPeak kA100{"A100", 312 * T, 312 * T, 156 * T, 19.5 * T};
constexpr DatasheetPeak kA100Pcie{"A100 PCIe", 312 * T, 312 * T, 156 * T, 19.5 * T};
constexpr DatasheetPeak kH100Sxm{"H100 SXM", 989 * T, 989 * T, 494.5 * T, 67 * T};
constexpr DatasheetPeak kH100Pcie{"H100 PCIe", 756 * T, 756 * T, 378 * T, 51 * T};
constexpr DatasheetPeak kH200Sxm{"H200 SXM", 989 * T, 989 * T, 494.5 * T, 67 * T};
constexpr DatasheetPeak kH200Nvl{"H200 NVL", 835 * T, 835 * T, 417.5 * T, 60 * T};
constexpr DatasheetPeak kB200{"B200", 2250 * T, 2250 * T, 1100 * T, 75 * T};

struct Name {
  const char* normalized;  // upper case, no "NVIDIA " prefix, '-' and '_' as spaces
  const DatasheetPeak* peak;
};

// The names the driver gives these boards. Exact matches only: "H100 NVL",
// "GH200 480GB" or a MIG slice ("A100 SXM4 40GB MIG 1g.5gb") are other
// devices, with other peaks, and get none.
constexpr Name kNames[] = {
    {"A100 SXM4 40GB", &kA100},      {"A100 SXM4 80GB", &kA100},    {"A100 SXM 80GB", &kA100},
    {"A100 PCIE 40GB", &kA100Pcie},  {"A100 PCIE 80GB", &kA100Pcie}, {"A100 80GB PCIE", &kA100Pcie},
    {"A100 40GB PCIE", &kA100Pcie},  {"H100 80GB HBM3", &kH100Sxm}, {"H100 SXM5 80GB", &kH100Sxm},
    {"H100 PCIE", &kH100Pcie},       {"H200", &kH200Sxm},           {"H200 SXM", &kH200Sxm},
    {"H200 NVL", &kH200Nvl},         {"B200", &kB200},
};

std::string normalize(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c == '-' || c == '_') c = ' ';
    if (c == ' ' && (out.empty() || out.back() == ' ')) continue;
    out.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  const std::string prefix = "NVIDIA ";
  if (out.compare(0, prefix.size(), prefix) == 0) out.erase(0, prefix.size());
  return out;
}

}  // namespace

double DatasheetPeak::flops(std::string_view dtype) const {
  if (dtype == "bf16") return bf16;
  if (dtype == "fp16") return fp16;
  if (dtype == "tf32") return tf32;
  if (dtype == "fp32") return fp32;
  return 0;
}

const DatasheetPeak* datasheet_peak(std::string_view device_name) {
  const std::string key = normalize(device_name);
  for (const Name& n : kNames)
    if (key == n.normalized) return n.peak;
  return nullptr;
}

}  // namespace smp
