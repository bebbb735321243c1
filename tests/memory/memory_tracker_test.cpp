// MemoryTracker counts what LibTorch's CPU allocator hands out on this thread
// while it lives: current bytes go up and down with tensors, the peak stays;
// frees of blocks it did not see neither count nor make LibTorch warn.
#include "memory/memory_tracker.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

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

TEST(MemoryTracker, TrackersNestAndTheInnermostCounts) {
  smp::MemoryTracker outer;
  at::Tensor a = at::empty({1 << 18}, at::kFloat);  // 1 MiB, the outer's
  {
    smp::MemoryTracker inner;
    at::Tensor b = at::empty({1 << 19}, at::kFloat);  // 2 MiB, the inner's
    EXPECT_EQ(inner.current(), int64_t{2} << 20);
    EXPECT_EQ(outer.current(), int64_t{1} << 20);
  }
  EXPECT_EQ(outer.current(), int64_t{1} << 20);
  at::Tensor c = at::empty({1 << 18}, at::kFloat);  // the outer's again
  EXPECT_EQ(outer.current(), int64_t{2} << 20);
}

// A block counts until it is freed, wherever: on another thread, or after its
// tracker ended (then it is simply gone from that tracker's count).
TEST(MemoryTracker, ABlockIsTakenOffItsOwnTrackerWhereverItIsFreed) {
  smp::MemoryTracker m;
  at::Tensor a = at::empty({1 << 18}, at::kFloat);
  EXPECT_EQ(m.current(), int64_t{1} << 20);
  std::thread([t = std::move(a)]() mutable { t.reset(); }).join();
  EXPECT_EQ(m.current(), 0);
  at::Tensor outlives;
  {
    smp::MemoryTracker inner;
    outlives = at::empty({1 << 18}, at::kFloat);
  }
  outlives.reset();  // off the ended inner tracker, not this one
  EXPECT_EQ(m.current(), 0);
}

// Issue 54: blocks allocated before a tracker started and freed while it runs
// (ZeRO-3's and tp's buffers, a step's leftovers) made LibTorch warn "Memory
// block of unknown size was allocated before the profiling started" (every
// 1000th such free) when the tracker was c10's memory profiler hook. They
// are not counted, and LibTorch has nothing to say.
TEST(MemoryTracker, FreeingBlocksFromBeforeTheTrackerIsSilentAndUncounted) {
  std::vector<at::Tensor> before;
  for (int i = 0; i < 2500; ++i) before.push_back(at::empty({64}, at::kFloat));
  testing::internal::CaptureStderr();
  {
    smp::MemoryTracker m;
    before.clear();
    EXPECT_EQ(m.current(), 0);
    EXPECT_EQ(m.peak(), 0);
  }
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("unknown size"), std::string::npos) << err;
  EXPECT_EQ(err, "");
}

}  // namespace
