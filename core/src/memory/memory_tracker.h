// Counts the bytes LibTorch's CPU allocator hands out on this thread (through
// c10's memory-reporting hook), to report peak activation memory per stage.
#pragma once

#include <cstdint>
#include <memory>

namespace smp {

class MemoryTracker {
 public:
  MemoryTracker();   // starts tracking the calling thread
  ~MemoryTracker();  // stops
  int64_t current() const;
  int64_t peak() const;
  void reset_peak();  // peak = current

 private:
  struct Reporter;
  std::shared_ptr<Reporter> reporter_;
};

}  // namespace smp
