#include "memory/activation_offload.h"

#include <smp/error.h>

#include <smp/common/checkpoint.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#ifdef SMP_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace smp {

struct ActivationOffload::Entry {
  at::Tensor as_is;   // kept on the device (nothing worth moving: undefined or empty)
  at::Tensor host;    // the host copy, until it is back on the device
  at::Tensor loaded;  // back on the device (or being copied there)
  int64_t bytes = 0;
#ifdef SMP_WITH_CUDA
  std::shared_ptr<at::cuda::CUDAEvent> copied, ready;  // the host copy done / the device copy done
#endif
};

#ifdef SMP_WITH_CUDA
struct ActivationOffload::Streams {
  c10::cuda::CUDAStream d2h, h2d;
};
#else
struct ActivationOffload::Streams {};
#endif

struct ActivationOffload::SlotStash : sdk::InputStash {
  explicit SlotStash(ActivationOffload* o) : owner(o) {}
  std::function<at::Tensor()> keep(const at::Tensor& input) override {
    std::shared_ptr<Entry> e = owner->offload(input);
    entries.push_back(e);
    ActivationOffload* o = owner;
    return [o, e] { return o->give_back(*e); };
  }
  ActivationOffload* owner;
  std::vector<std::shared_ptr<Entry>> entries;
};

ActivationOffload::ActivationOffload(c10::Device device, int horizon) : device_(device), horizon_(horizon) {
  if (horizon_ < 1) throw Error("activation offload: the loading horizon must be at least 1");
  if (device_.is_cuda()) {
#ifdef SMP_WITH_CUDA
    streams_.reset(new Streams{c10::cuda::getStreamFromPool(false, device_.index()),
                               c10::cuda::getStreamFromPool(false, device_.index())});
#else
    throw Error("activation offload: this build of smp has no CUDA");
#endif
  }
}

ActivationOffload::~ActivationOffload() = default;

sdk::InputStash* ActivationOffload::stash(int microbatch, int chunk) {
  auto& s = slots_[{microbatch, chunk}];
  if (!s) s = std::make_unique<SlotStash>(this);
  return s.get();
}

std::shared_ptr<ActivationOffload::Entry> ActivationOffload::offload(const at::Tensor& t) {
  auto e = std::make_shared<Entry>();
  if (!t.defined() || t.numel() == 0) {
    e->as_is = t;
    return e;
  }
  c10::NoGradGuard no_grad;
  const at::Tensor src = t.detach();
  e->bytes = src.numel() * static_cast<int64_t>(src.element_size());
#ifdef SMP_WITH_CUDA
  if (src.is_cuda()) {
    // The copy waits for the compute that made the tensor, then runs beside
    // the next compute; the source's memory returns to the allocator once the
    // copy stream is done with it.
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(src.device().index());
    at::cuda::CUDAEvent made;
    made.record(compute);
    made.block(streams_->d2h);
    e->copied = std::make_shared<at::cuda::CUDAEvent>();
    {
      c10::cuda::CUDAStreamGuard guard(streams_->d2h);
      e->host = at::empty(src.sizes(), src.options().device(at::kCPU).pinned_memory(true));
      e->host.copy_(src, /*non_blocking=*/true);
      e->copied->record(streams_->d2h);
    }
    c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), streams_->d2h);
  } else
#endif
  {
    e->host = src.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
  }
  host_bytes_ += e->bytes;
  host_peak_ = std::max(host_peak_, host_bytes_);
  ++offloaded_;
  return e;
}

void ActivationOffload::load(Entry& e) {
  if (e.loaded.defined() || !e.host.defined()) return;
  c10::NoGradGuard no_grad;
#ifdef SMP_WITH_CUDA
  if (device_.is_cuda()) {
    // Allocated on the load stream (its blocks are reused only in its order)
    // and marked used by the compute stream, which reads it in backward.
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    e.copied->block(streams_->h2d);
    e.ready = std::make_shared<at::cuda::CUDAEvent>();
    {
      c10::cuda::CUDAStreamGuard guard(streams_->h2d);
      e.loaded = at::empty(e.host.sizes(), e.host.options().device(device_).pinned_memory(false));
      e.loaded.copy_(e.host, /*non_blocking=*/true);
      e.ready->record(streams_->h2d);
    }
    c10::cuda::CUDACachingAllocator::recordStream(e.loaded.storage().data_ptr(), compute);
    return;
  }
#endif
  e.loaded = e.host.to(device_, /*non_blocking=*/false, /*copy=*/true);
}

at::Tensor ActivationOffload::give_back(Entry& e) {
  if (!e.host.defined() && !e.loaded.defined()) return e.as_is;
  load(e);  // not prefetched (beyond the horizon): now, on the critical path
#ifdef SMP_WITH_CUDA
  if (e.ready) e.ready->block(c10::cuda::getCurrentCUDAStream(device_.index()));
#endif
  // The pinned block stays reserved until the copy reading it is done (the
  // caching host allocator records the copy's stream), so it can go now.
  e.host = at::Tensor();
  host_bytes_ -= e.bytes;
  at::Tensor out = std::move(e.loaded);
  e.loaded = at::Tensor();
  return out;
}

void ActivationOffload::prefetch(int microbatch, int chunk) {
  auto it = slots_.find({microbatch, chunk});
  if (it == slots_.end()) return;
  for (auto& e : it->second->entries) load(*e);
}

void ActivationOffload::clear() {
  slots_.clear();
  host_bytes_ = 0;
  host_peak_ = 0;
}

}  // namespace smp
