#include "comm/event_watcher.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

namespace smp {
namespace {

class EventWatcher {
 public:
  EventWatcher() : thread_([this] { loop(); }) {}
  ~EventWatcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void add(std::shared_ptr<Work> work, std::function<void()> fire) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back({std::move(work), std::move(fire)});
    }
    cv_.notify_all();
  }

 private:
  struct Pending {
    std::shared_ptr<Work> work;
    std::function<void()> fire;
  };
  void loop() {
    std::vector<Pending> mine;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        // Asleep while nothing is pending; else a short poll interval.
        if (pending_.empty() && mine.empty()) cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
        else cv_.wait_for(lock, std::chrono::microseconds(100), [&] { return stop_; });
        if (stop_) return;  // at exit: callbacks still pending are dropped
        for (auto& p : pending_) mine.push_back(std::move(p));
        pending_.clear();
      }
      std::vector<Pending> still;
      for (auto& p : mine) {
        bool ready = true;
        try {
          ready = p.work->ready();
        } catch (...) {
        }
        if (ready) p.fire();
        else still.push_back(std::move(p));
      }
      mine.swap(still);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> pending_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

void watch_until_ready(std::shared_ptr<Work> work, std::function<void()> fire) {
  static EventWatcher watcher;
  watcher.add(std::move(work), std::move(fire));
}

}  // namespace smp
