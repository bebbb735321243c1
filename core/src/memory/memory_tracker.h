// Counts the bytes LibTorch's CPU allocator hands out on this thread while a
// tracker lives (through an allocator smp puts in front of LibTorch's), to
// report peak activation memory per stage. A block counts until it is freed,
// on any thread; blocks allocated before the tracker or on other threads do
// not count, and their frees do not either.
#pragma once

#include <cstdint>
#include <memory>

namespace smp {

class MemoryTracker {
 public:
  MemoryTracker();   // starts tracking the calling thread (trackers nest: the innermost counts)
  ~MemoryTracker();  // stops
  MemoryTracker(const MemoryTracker&) = delete;
  MemoryTracker& operator=(const MemoryTracker&) = delete;
  int64_t current() const;
  int64_t peak() const;
  void reset_peak();  // peak = current

  struct Reporter;  // the counters, shared with the blocks still counted

 private:
  std::shared_ptr<Reporter> reporter_;
  std::shared_ptr<Reporter> previous_;  // the tracker this one hides, restored when it ends
};

}  // namespace smp
