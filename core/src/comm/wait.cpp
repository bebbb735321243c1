#include "comm/wait.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>

namespace smp {

WaitFailed WaitFailed::timeout(std::string_view what, std::chrono::milliseconds waited, std::string_view label,
                               const std::vector<int>& missing) {
  std::string who;
  for (int r : missing) who += (who.empty() ? "" : ", ") + std::to_string(r);
  std::string m = "timed out after " + std::to_string(waited.count()) + " ms waiting for " + std::string(what);
  if (!who.empty()) m += "; missing: " + std::string(label) + (missing.size() > 1 ? "s " : " ") + who;
  return WaitFailed(Why::kTimeout, m);
}

WaitFailed WaitFailed::peer_exited(std::string_view what, std::string_view label, int rank, int pid) {
  return WaitFailed(Why::kPeerExited, std::string(label) + " " + std::to_string(rank) + " (pid " +
                                          std::to_string(pid) + ") exited while this rank waited for " +
                                          std::string(what));
}

namespace shm {
namespace {

using Clock = std::chrono::steady_clock;

// Sleeps while *word == seen, for at most 5 ms: the bound is what lets the
// waiter check its peers, its stop flag and its deadline.
void futex_wait(std::atomic<uint32_t>* word, uint32_t seen) {
  timespec ts{0, 5'000'000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

bool exited(int pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

}  // namespace

void notify(WakeWord& w) {
  w.futex.fetch_add(1);
  if (w.sleepers.load() > 0)
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&w.futex), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void sleep_until(const WaitFor& w, const std::function<bool()>& reached) {
  const auto start = Clock::now();
  auto next_liveness_check = start + std::chrono::milliseconds(100);
  for (;;) {
    // Counted as a sleeper before the word is read: a publisher that bumps it
    // after this sees the count and wakes us (or the word differs and
    // futex_wait returns at once).
    w.word->sleepers.fetch_add(1);
    const uint32_t seen = w.word->futex.load();
    bool ok = false;
    try {
      ok = reached();
    } catch (...) {
      w.word->sleepers.fetch_sub(1);
      throw;
    }
    if (!ok) futex_wait(&w.word->futex, seen);
    w.word->sleepers.fetch_sub(1);
    if (ok || reached()) return;
    if (w.stop && w.stop->load())
      throw WaitFailed(WaitFailed::Why::kStopped,
                       std::string(w.stop_reason) + " while this rank waited for " + std::string(w.what));
    const auto now = Clock::now();
    if (now >= next_liveness_check && w.missing) {
      next_liveness_check = now + std::chrono::milliseconds(100);
      for (const Peer& p : w.missing())
        // What it published before it exited still counts.
        if (exited(p.pid) && !reached()) throw WaitFailed::peer_exited(w.what, "group rank", p.rank, p.pid);
    }
    if (now - start >= w.timeout) {
      std::vector<int> late;
      if (w.missing)
        for (const Peer& p : w.missing()) late.push_back(p.rank);
      throw WaitFailed::timeout(w.what, w.timeout, "group rank", late);
    }
  }
}

}  // namespace shm
}  // namespace smp
