// NVIDIA's datasheet dense peaks (no 2:4 sparsity) for the GPUs smp knows by
// name: what MFU is stated against, as PaLM and Megatron state it. Keyed by
// the device name as the CUDA driver reports it (cudaDeviceProp::name,
// torch.cuda.get_device_name): "NVIDIA H100 80GB HBM3" is the H100 SXM,
// "NVIDIA H200" the H200 SXM. A name the table does not hold (another GPU, a
// MIG slice, the CPU) has no entry: MFU is then stated against a GEMM peak
// measured in the run, and says so. Pure C++: no LibTorch here.
#pragma once

#include <string>
#include <string_view>

namespace smp {

struct DatasheetPeak {
  const char* gpu;  // "H100 SXM", "A100 PCIe", ...: the datasheet's column
  // Dense FLOP/s per GPU at each tensor-core input dtype; fp32 is the
  // non-tensor-core rate (a GEMM in fp32 without TF32).
  double bf16, fp16, tf32, fp32;
  // The peak for "bf16", "fp16", "tf32" or "fp32"; 0 for any other name.
  double flops(std::string_view dtype) const;
};

// The entry for a CUDA device name (compared without case, "NVIDIA " prefix,
// and with '-' and '_' read as spaces), or null when the table has none.
const DatasheetPeak* datasheet_peak(std::string_view device_name);

}  // namespace smp
