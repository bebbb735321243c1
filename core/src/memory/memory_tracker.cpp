#include "memory/memory_tracker.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>

namespace smp {

// The totals' type of MemoryReportingInfoBase::reportMemoryUsage: int64_t in
// LibTorch 1.13, size_t in 2.x.
#if TORCH_VERSION_MAJOR >= 2
using AllocatorTotal = size_t;
#else
using AllocatorTotal = int64_t;
#endif

struct MemoryTracker::Reporter : c10::MemoryReportingInfoBase {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  void reportMemoryUsage(void*, int64_t alloc_size, AllocatorTotal, AllocatorTotal, c10::Device device) override {
    if (!device.is_cpu()) return;
    int64_t now = current.fetch_add(alloc_size) + alloc_size;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
};

MemoryTracker::MemoryTracker() : reporter_(std::make_shared<Reporter>()) {
  c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, reporter_);
}

MemoryTracker::~MemoryTracker() { c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE); }

int64_t MemoryTracker::current() const { return reporter_->current.load(); }
int64_t MemoryTracker::peak() const { return reporter_->peak.load(); }
void MemoryTracker::reset_peak() { reporter_->peak.store(reporter_->current.load()); }

}  // namespace smp
