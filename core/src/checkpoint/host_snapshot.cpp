#include "checkpoint/host_snapshot.h"

#include <ATen/ATen.h>

#ifdef SMP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <smp/error.h>

#include <string>

namespace smp {

#ifdef SMP_WITH_CUDA
struct HostSnapshot::Device {
  int index = -1;
  at::cuda::CUDAEvent final_state;  // recorded on the compute stream by mark()
  void* buffer = nullptr;           // pinned (cudaHostAlloc)
  int64_t bytes = 0;

  ~Device() {
    if (buffer) (void)cudaFreeHost(buffer);
  }
  void reserve(int64_t want) {
    if (want <= bytes) return;
    if (buffer) (void)cudaFreeHost(buffer);
    buffer = nullptr;
    bytes = 0;
    if (cudaHostAlloc(&buffer, static_cast<size_t>(want), cudaHostAllocDefault) != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error("checkpoint: cannot pin " + std::to_string(want) + " bytes of host memory for the snapshot of cuda:" +
                  std::to_string(index));
    }
    bytes = want;
  }
};
#else
struct HostSnapshot::Device {};
#endif

HostSnapshot::HostSnapshot() = default;
HostSnapshot::~HostSnapshot() = default;

#ifdef SMP_WITH_CUDA
namespace {
int64_t aligned(int64_t n) { return (n + 255) / 256 * 256; }
}  // namespace

void HostSnapshot::mark(const std::vector<at::Tensor>& tensors) {
  for (const auto& t : tensors) {
    if (!t.is_cuda()) continue;
    const int index = t.device().index();
    bool seen = false;
    for (auto& d : devices_) seen = seen || d->index == index;
    if (seen) continue;
    auto d = std::make_unique<Device>();
    d->index = index;
    devices_.push_back(std::move(d));
  }
  for (auto& d : devices_) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(d->index));
    d->final_state.record(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(d->index)));
  }
}

std::vector<at::Tensor> HostSnapshot::copy(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out(tensors.size());
  for (auto& d : devices_) {
    int64_t want = 0;
    for (const auto& t : tensors)
      if (t.is_cuda() && t.device().index() == d->index) want += aligned(t.numel() * t.element_size());
    if (want == 0) continue;
    d->reserve(want);
    const auto dev = static_cast<c10::DeviceIndex>(d->index);
    c10::cuda::CUDAGuard guard(dev);
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, dev);
    c10::cuda::CUDAStreamGuard on_side(side);
    d->final_state.block(side);  // the copies read the state as it was when the save was asked for
    int64_t offset = 0;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const at::Tensor& t = tensors[i];
      if (!t.is_cuda() || t.device().index() != d->index) continue;
      at::Tensor host = at::from_blob(static_cast<char*>(d->buffer) + offset, t.sizes(),
                                      t.options().device(at::kCPU).pinned_memory(true));
      host.copy_(t, /*non_blocking=*/true);
      out[i] = host;
      offset += aligned(t.numel() * t.element_size());
    }
    side.synchronize();
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!out[i].defined()) out[i] = tensors[i].to(at::kCPU).contiguous().clone();
  return out;
}

int64_t HostSnapshot::pinned_bytes() const {
  int64_t n = 0;
  for (const auto& d : devices_) n += d->bytes;
  return n;
}
#else
void HostSnapshot::mark(const std::vector<at::Tensor>&) {}

std::vector<at::Tensor> HostSnapshot::copy(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.to(at::kCPU).contiguous().clone());
  return out;
}

int64_t HostSnapshot::pinned_bytes() const { return 0; }
#endif

}  // namespace smp
