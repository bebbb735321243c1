// MemoryTracker counts what LibTorch's CPU allocator hands out on this thread
// while it lives: current bytes go up and down with tensors, the peak stays.
#include "memory/memory_tracker.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

namespace {

TEST(MemoryTracker, CurrentFollowsTensorsAndThePeakStays) {
  smp::MemoryTracker m;
  EXPECT_EQ(m.current(), 0);
  {
    at::Tensor a = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    EXPECT_GE(m.current(), int64_t{4} << 20);
    at::Tensor b = at::empty({1 << 19}, at::kFloat);  // + 2 MiB
    EXPECT_GE(m.peak(), int64_t{6} << 20);
  }
  EXPECT_EQ(m.current(), 0);               // both freed
  EXPECT_GE(m.peak(), int64_t{6} << 20);   // the peak remembers
  m.reset_peak();
  EXPECT_EQ(m.peak(), 0);
}

TEST(MemoryTracker, OtherThreadsAreNotCounted) {
  smp::MemoryTracker m;
  std::thread([] { at::Tensor t = at::empty({1 << 20}, at::kFloat); }).join();
  EXPECT_EQ(m.peak(), 0);
}

}  // namespace
