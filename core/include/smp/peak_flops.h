// What MFU is stated against, per rank (Runtime::measure_peaks): the device's
// datasheet dense peak in the dtype its GEMMs run at, where smp's table of
// GPUs knows the device, and a GEMM peak measured in the run beside it. MFU is
// stated against the datasheet peak (as PaLM and Megatron state it) and falls
// back to the measured one, labelled so, for an unknown GPU and the CPU.
#pragma once

#include <string>

namespace smp {

struct PeakFlops {
  std::string device_name;    // as the driver names it: "NVIDIA H200"; "cpu"
  std::string dtype;          // the datasheet column: "bf16", "fp16", "tf32", "fp32"
  std::string datasheet_gpu;  // the table's entry ("H200 SXM"); "" when none
  double datasheet = 0;       // FLOP/s, dense; 0 without an entry
  double measured = 0;        // FLOP/s, the best of a few timed GEMMs on the device

  bool has_datasheet() const { return datasheet > 0; }
  // The peak MFU is stated against: the datasheet's where known.
  double mfu_peak() const { return has_datasheet() ? datasheet : measured; }
  // "datasheet H200 SXM bf16", or "measured GEMM (no datasheet figure for cpu)".
  std::string basis() const {
    return has_datasheet() ? "datasheet " + datasheet_gpu + " " + dtype
                           : "measured GEMM (no datasheet figure for " + device_name + ")";
  }
};

}  // namespace smp
