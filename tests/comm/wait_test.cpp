// The one wait of comm/ (wait.h) and the one store-counter wait
// (store_wait.h), in process: the deadline fires with its message, a peer that
// exited is named within the liveness interval, a publish wakes the sleeper,
// the stop flag ends the wait, and a barrier that times out names the parties
// that never arrived.
#include "comm/c10d_compat.h"
#include "comm/store_wait.h"
#include "comm/wait.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <thread>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The message and kind of the WaitFailed f throws (the test fails when it throws none).
struct Failed {
  std::string message;
  smp::WaitFailed::Why why = smp::WaitFailed::Why::kStopped;
  bool thrown = false;
};
template <class F>
Failed failure_of(F&& f) {
  Failed out;
  try {
    f();
  } catch (const smp::WaitFailed& e) {
    out = {e.what(), e.why(), true};
  }
  return out;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ShmWaitTest, TheDeadlineFiresWithWhatWasAwaitedAndWhoWasMissing) {
  smp::shm::WakeWord word{};
  smp::shm::WaitFor w;
  w.word = &word;
  w.timeout = 300ms;
  w.what = "a shared-memory all-reduce";
  w.missing = [] { return std::vector<smp::shm::Peer>{{1, 0}, {3, 0}}; };  // pid 0: not checked
  const auto start = Clock::now();
  const Failed f = failure_of([&] { smp::shm::wait_until(w, [] { return false; }); });
  const double took = seconds_since(start);
  ASSERT_TRUE(f.thrown);
  EXPECT_EQ(f.why, smp::WaitFailed::Why::kTimeout);
  EXPECT_EQ(f.message, "timed out after 300 ms waiting for a shared-memory all-reduce; missing: group ranks 1, 3");
  EXPECT_GE(took, 0.3);
  EXPECT_LT(took, 5.0);
}

// A child that has exited (and been reaped) has a pid kill(pid, 0) no longer
// finds: the wait names it within ~100 ms, long before its 60 s deadline.
TEST(ShmWaitTest, APeerThatExitedIsNamedLongBeforeTheDeadline) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  smp::shm::WakeWord word{};
  smp::shm::WaitFor w;
  w.word = &word;
  w.timeout = 60s;
  w.what = "its message (tag 2)";
  w.missing = [&] { return std::vector<smp::shm::Peer>{{0, static_cast<int>(getpid())}, {1, static_cast<int>(child)}}; };
  const auto start = Clock::now();
  const Failed f = failure_of([&] { smp::shm::wait_until(w, [] { return false; }); });
  ASSERT_TRUE(f.thrown);
  EXPECT_EQ(f.why, smp::WaitFailed::Why::kPeerExited);
  EXPECT_EQ(f.message, "group rank 1 (pid " + std::to_string(child) +
                           ") exited while this rank waited for its message (tag 2)");
  EXPECT_LT(seconds_since(start), 5.0);
}

TEST(ShmWaitTest, APublishWakesTheSleeperAtOnce) {
  smp::shm::WakeWord word{};
  std::atomic<bool> ready{false};
  smp::shm::WaitFor w;
  w.word = &word;
  w.timeout = 30s;
  w.what = "a flag";
  std::thread publisher([&] {
    std::this_thread::sleep_for(50ms);
    ready = true;
    smp::shm::notify(word);
  });
  const auto start = Clock::now();
  smp::shm::wait_until(w, [&] { return ready.load(); });
  const double took = seconds_since(start);
  publisher.join();
  EXPECT_TRUE(ready.load());
  EXPECT_LT(took, 2.0);
  EXPECT_EQ(word.sleepers.load(), 0u);  // every sleeper left
}

TEST(ShmWaitTest, TheStopFlagEndsTheWaitWithItsReason) {
  smp::shm::WakeWord word{};
  std::atomic<bool> stop{false};
  smp::shm::WaitFor w;
  w.word = &word;
  w.timeout = 60s;
  w.what = "a shared-memory reduce-scatter";
  w.stop = &stop;
  w.stop_reason = "the communicator was destroyed";
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    stop = true;
  });
  const Failed f = failure_of([&] { smp::shm::wait_until(w, [] { return false; }); });
  stopper.join();
  ASSERT_TRUE(f.thrown);
  EXPECT_EQ(f.why, smp::WaitFailed::Why::kStopped);
  EXPECT_EQ(f.message, "the communicator was destroyed while this rank waited for a shared-memory reduce-scatter");
}

// A store in memory, as c10d's TCPStore behaves for these calls.
class MemoryStore final : public smp::c10d_compat::Store {
 public:
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    kv_[key] = value;
  }
  std::string get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return kv_.at(key);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t v = (kv_.count(key) ? std::stoll(kv_[key]) : 0) + delta;
    kv_[key] = std::to_string(v);
    return v;
  }
  bool check(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return kv_.count(key) > 0;
  }
  void set_timeout(std::chrono::milliseconds) override {}

 private:
  std::mutex mu_;
  std::map<std::string, std::string> kv_;
};

TEST(StoreWaitTest, ReturnsOnceEveryPartyArrived) {
  MemoryStore store;
  std::thread late([&] {
    std::this_thread::sleep_for(50ms);
    smp::arrive(store, "b", 2);
  });
  smp::arrive(store, "b", 0);
  smp::arrive(store, "b", 1);
  const auto start = Clock::now();
  smp::wait_for_arrivals(store, "b", 3, 30s, "every rank", "world rank");
  late.join();
  EXPECT_LT(seconds_since(start), 5.0);
  EXPECT_EQ(store.add("b", 0), 3);
}

TEST(StoreWaitTest, ATimeoutNamesThePartiesThatNeverArrived) {
  MemoryStore store;
  smp::arrive(store, "b", 0);
  smp::arrive(store, "b", 2);
  const auto start = Clock::now();
  const Failed f = failure_of([&] { smp::wait_for_arrivals(store, "b", 4, 200ms, "every rank to finish", "world rank"); });
  ASSERT_TRUE(f.thrown);
  EXPECT_EQ(f.why, smp::WaitFailed::Why::kTimeout);
  EXPECT_EQ(f.message, "timed out after 200 ms waiting for every rank to finish; missing: world ranks 1, 3");
  EXPECT_GE(seconds_since(start), 0.2);
  // One missing party: the singular.
  smp::arrive(store, "b", 1);
  EXPECT_TRUE(contains(failure_of([&] { smp::wait_for_arrivals(store, "b", 4, 10ms, "x", "world rank"); }).message,
                       "; missing: world rank 3"));
}

// Barriers of different keys do not count each other's arrivals.
TEST(StoreWaitTest, KeysAreSeparateBarriers) {
  MemoryStore store;
  for (int p = 0; p < 3; ++p) smp::arrive(store, "first", p);
  const Failed f = failure_of([&] { smp::wait_for_arrivals(store, "second", 3, 10ms, "the second", "group rank"); });
  ASSERT_TRUE(f.thrown);
  EXPECT_TRUE(contains(f.message, "missing: group ranks 0, 1, 2")) << f.message;
}

}  // namespace
