#include "memory/memory_tracker.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/version.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>

// How the bytes are counted: smp puts an allocator in front of LibTorch's CPU
// allocator once. A block allocated on a thread with a live tracker is noted
// (its size and that tracker's counter) and handed out with a deleter that
// takes it off that counter when it is freed, on whatever thread; every other
// block is LibTorch's own, untouched. Earlier the tracker was c10's memory
// profiler hook (a PROFILER_STATE debug info), which made c10 warn "Memory
// block of unknown size was allocated before the profiling started" for every
// 1000th free of a block allocated before a tracker started (issue 54): such
// frees now never reach a tracker, so c10's profiler is never switched on.

namespace smp {

struct MemoryTracker::Reporter {
  std::atomic<int64_t> current{0};
  std::atomic<int64_t> peak{0};
  void add(int64_t bytes) {
    const int64_t now = current.fetch_add(bytes) + bytes;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
};

namespace {

using Reporter = MemoryTracker::Reporter;

// The tracker counting this thread's allocations (the innermost one), or null.
thread_local std::shared_ptr<Reporter> t_active;

// The blocks allocated under a tracker. Never destroyed: tensors may be freed
// during static destruction.
struct Blocks {
  std::mutex mu;
  std::unordered_map<void*, std::pair<int64_t, std::shared_ptr<Reporter>>> of;
  c10::DeleterFnPtr base_deleter = nullptr;  // the wrapped allocator's
};
Blocks& blocks() {
  static auto* b = new Blocks;
  return *b;
}

void tracked_delete(void* ptr) {
  Blocks& b = blocks();
  std::pair<int64_t, std::shared_ptr<Reporter>> block;
  {
    std::lock_guard<std::mutex> lock(b.mu);
    auto it = b.of.find(ptr);
    if (it != b.of.end()) {
      block = std::move(it->second);
      b.of.erase(it);
    }
  }
  if (block.second) block.second->add(-block.first);
  b.base_deleter(ptr);
}

// allocate() is const up to LibTorch 2.2; copy_data() (for clone()) is the
// allocator's to define since 2.3 at the latest.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define SMP_ALLOCATE_CONST
#define SMP_COPY_DATA_OVERRIDE override
#else
#define SMP_ALLOCATE_CONST const
#define SMP_COPY_DATA_OVERRIDE
#endif

class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t n) SMP_ALLOCATE_CONST override {
    c10::DataPtr d = base_->allocate(n);
    const std::shared_ptr<Reporter>& reporter = t_active;
    Blocks& b = blocks();
    // Only a plain block of the wrapped allocator (its pointer is its context).
    if (!reporter || n == 0 || !d.get() || d.get() != d.get_context() || d.get_deleter() != b.base_deleter) return d;
    void* ptr = d.get();
    const c10::Device device = d.device();
    {
      std::lock_guard<std::mutex> lock(b.mu);
      b.of[ptr] = {static_cast<int64_t>(n), reporter};
    }
    reporter->add(static_cast<int64_t>(n));
    d.release_context();
    return c10::DataPtr(ptr, ptr, &tracked_delete, device);
  }
  // Frees blocks of either kind (tracked or the wrapped allocator's own).
  c10::DeleterFnPtr raw_deleter() const override { return &tracked_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const SMP_COPY_DATA_OVERRIDE {
    std::memcpy(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

#undef SMP_ALLOCATE_CONST
#undef SMP_COPY_DATA_OVERRIDE

// Puts the tracking allocator in front of the CPU allocator, once. An
// allocator without a raw deleter is not wrapped (trackers then count nothing).
void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    c10::Allocator* base = c10::GetCPUAllocator();
    blocks().base_deleter = base->raw_deleter();
    if (!blocks().base_deleter) return;
    c10::SetCPUAllocator(new TrackingAllocator(base), 255);  // never freed: storages keep a pointer to it
  });
}

}  // namespace

MemoryTracker::MemoryTracker() : reporter_(std::make_shared<Reporter>()) {
  install();
  previous_ = std::move(t_active);
  t_active = reporter_;
}

MemoryTracker::~MemoryTracker() { t_active = std::move(previous_); }

int64_t MemoryTracker::current() const { return reporter_->current.load(); }
int64_t MemoryTracker::peak() const { return reporter_->peak.load(); }
void MemoryTracker::reset_peak() { reporter_->peak.store(reporter_->current.load()); }

}  // namespace smp
