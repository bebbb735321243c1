#include "base/device.h"

#include "base/datasheet_peaks.h"

#include <smp/error.h>

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#ifdef SMP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

#include <ATen/ATen.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>

namespace smp {

int cuda_index_for(int local_rank, const std::vector<int>& devices, int count, const char* visible, std::string* why) {
  if (!devices.empty()) {
    if (local_rank >= static_cast<int>(devices.size())) {
      *why = "run.devices has " + std::to_string(devices.size()) + " entries, but it needs entry " +
             std::to_string(local_rank) + " (one per local rank)";
      return -1;
    }
    const int index = devices[local_rank];
    if (index >= count) {
      *why = "it would use cuda:" + std::to_string(index) + ", but it sees " + std::to_string(count) +
             " GPU(s) (run.devices)";
      return -1;
    }
    return index;
  }
  if (local_rank < count) return local_rank;
  const std::string list = visible ? visible : "";
  if (count == 1 && !list.empty() && list.find(',') == std::string::npos) return 0;  // a GPU per task
  *why = "it would use cuda:" + std::to_string(local_rank) + ", but it sees " + std::to_string(count) + " GPU(s)" +
         (visible ? " (CUDA_VISIBLE_DEVICES=" + list + ")" : "") +
         "; several ranks can share one with run.devices (e.g. [0, 0])";
  return -1;
}

c10::Device rank_device(const RunConfig& run, const ProcessEnv& env, const std::string& origin) {
  if (run.device != DeviceKind::Cuda) return c10::Device(c10::kCPU);
  const std::string who = "rank " + std::to_string(env.rank) + " (local rank " + std::to_string(env.local_rank) + ")";
  const int count = at::detail::getCUDAHooks().getNumGPUs();
  std::string why;
  const int index = cuda_index_for(env.local_rank, run.devices, count, std::getenv("CUDA_VISIBLE_DEVICES"), &why);
  if (index < 0) throw Error(origin + ": run.device = \"cuda\": " + who + ": " + why);
  c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
  // Current device first: NCCL communicators and the caching allocator use it.
  c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
  return device;
}

std::string device_key(const c10::Device& device) {
  if (!device.is_cuda()) return "";
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
#ifdef SMP_WITH_CUDA
  char bus[64] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device.index()) == cudaSuccess) return std::string(host) + "/pci:" + bus;
  (void)cudaGetLastError();
#endif
  return std::string(host) + "/" + device.str();
}

PeakFlops measure_peaks(const c10::Device& device, c10::ScalarType compute) {
  PeakFlops p;
  p.device_name = device_name(device);
  p.dtype = gemm_dtype_name(device, compute);
  if (device.is_cuda())
    if (const DatasheetPeak* d = datasheet_peak(p.device_name)) {
      p.datasheet_gpu = d->gpu;
      p.datasheet = d->flops(p.dtype);
    }
  p.measured = gemm_peak_flops(device, compute);
  return p;
}

double gemm_peak_flops(const c10::Device& device, c10::ScalarType dtype) {
  // Best of a few samples: a noisy neighbour can only lower one.
  double best = 0;
  const bool gpu = device.is_cuda();
  const std::vector<int64_t> sizes = gpu ? std::vector<int64_t>{8192} : std::vector<int64_t>{512, 1024};
  const int reps = gpu ? 5 : 3, per_rep = gpu ? 10 : 2;
  const auto dt = gpu ? dtype : at::kFloat;
  for (int64_t n : sizes) {
    auto opts = at::TensorOptions().dtype(dt).device(device);
    at::Tensor a = at::randn({n, n}, opts), b = at::randn({n, n}, opts);
    at::Tensor c = at::mm(a, b);  // warm-up
    synchronize(device);
    for (int rep = 0; rep < reps; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < per_rep; ++i) c = at::mm(a, b);
      synchronize(device);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, per_rep * 2.0 * n * n * n / s);
    }
  }
  return best;
}

std::string gemm_dtype_name(const c10::Device& device, c10::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return "bf16";
    case at::kHalf: return "fp16";
    default: break;
  }
  return device.is_cuda() && at::globalContext().allowTF32CuBLAS() ? "tf32" : "fp32";
}

#ifdef SMP_WITH_CUDA
// Not run on a GPU yet: written against the CUDA runtime's documented API.
std::string device_name(const c10::Device& device) {
  if (!device.is_cuda()) return "cpu";
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device.index()) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: the name is informative, not worth failing the run
    return "cuda (name unknown)";
  }
  return prop.name;
}
int64_t device_peak_bytes(const c10::Device& device) {
  if (!device.is_cuda()) return 0;
  // Index 0 of a statistic is the aggregate over pool kinds.
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].peak;
}
int64_t reset_device_peak(const c10::Device& device) {
  if (!device.is_cuda()) return 0;
  c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
}
int64_t device_allocated_bytes(const c10::Device& device) {
  if (!device.is_cuda()) return 0;
  return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).allocated_bytes[0].current;
}
void synchronize(const c10::Device& device) {
  if (device.is_cuda()) c10::cuda::device_synchronize();
}
#else
std::string device_name(const c10::Device&) { return "cpu"; }
int64_t device_allocated_bytes(const c10::Device&) { return 0; }
int64_t device_peak_bytes(const c10::Device&) { return 0; }
int64_t reset_device_peak(const c10::Device&) { return 0; }
void synchronize(const c10::Device&) {}
#endif

}  // namespace smp
