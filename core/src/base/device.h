// The rank's device: which one (run.device, run.devices, LOCAL_RANK), making it
// current, and what the CUDA caching allocator says about its memory. The one
// place the core touches CUDA's runtime; without CUDA (Debian's LibTorch 1.13)
// it answers for the CPU only.
#pragma once

#include <smp/job_config.h>
#include <smp/process_env.h>

#include <smp/peak_flops.h>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace smp {

// cuda:run.devices[local_rank] (or cuda:local_rank) for a CUDA job, checked
// against the GPUs present and made current; the CPU otherwise. Errors name
// run.device / run.devices and the rank.
c10::Device rank_device(const RunConfig& run, const ProcessEnv& env, const std::string& origin);

// The CUDA index a rank uses, from its local rank, run.devices (empty: none)
// and the GPUs it sees (`visible`: CUDA_VISIBLE_DEVICES, null when unset).
// A scheduler that gives each task a GPU of its own (srun --gpus-per-task=1)
// shows every rank one device, cuda:0, whatever its local rank: with no
// run.devices, one GPU and CUDA_VISIBLE_DEVICES naming exactly one, that is
// the rank's. Else local_rank (or its run.devices entry); -1 with *why set
// when that is not a GPU it sees.
int cuda_index_for(int local_rank, const std::vector<int>& devices, int count, const char* visible, std::string* why);

// What MFU is stated against on `device` for a job computing in `compute`:
// the datasheet peak from the table (datasheet_peaks.h) where it knows the
// GPU, and the GEMM peak measured now (gemm_peak_flops).
PeakFlops measure_peaks(const c10::Device& device, c10::ScalarType compute);

// "host/<GPU>" for a CUDA device (the GPU's PCI bus id where CUDA is compiled
// in, so ranks that each see their one GPU as cuda:0 still differ), "" for
// the CPU: ranks with equal keys share a GPU.
std::string device_key(const c10::Device& device);

// Peak bytes the caching allocator handed out on a CUDA device since the last
// reset (0 for the CPU or without CUDA), and the reset, which returns the bytes
// allocated now (what the step's peak is measured above).
int64_t device_peak_bytes(const c10::Device& device);
int64_t reset_device_peak(const c10::Device& device);
// Bytes the caching allocator has handed out on a CUDA device now (0 otherwise).
int64_t device_allocated_bytes(const c10::Device& device);

// Waits for the device's queued work (a no-op on the CPU), for timings.
void synchronize(const c10::Device& device);

// The best rate of a few timed square GEMMs on `device` in `dtype` (FLOP/s):
// the peak that MFU is measured against, taken in the same run. CPU: fp32 at
// 512 and 1024; CUDA: 8192 (the size where an H200 reaches its bf16 peak).
double gemm_peak_flops(const c10::Device& device, c10::ScalarType dtype);

// The device as its driver names it (cudaDeviceProp::name: "NVIDIA H200",
// "NVIDIA A100-SXM4-80GB"); "cpu" for the CPU. The key of the datasheet table
// (base/datasheet_peaks.h).
std::string device_name(const c10::Device& device);

// The datasheet column a GEMM in `dtype` runs at: "bf16", "fp16", "fp32", or
// on CUDA "tf32" for fp32 when cuBLAS may use TF32 (LibTorch's
// allow_tf32 for matmul; off by default).
std::string gemm_dtype_name(const c10::Device& device, c10::ScalarType dtype);

}  // namespace smp
