// The one wait of comm/: how a rank waits for its peers, and how that wait
// fails. Shared memory (shm_collectives, shm_mailbox) waits here on a word in
// the segment; a store counter (store_wait.h) fails the same way.
//
// A shared-memory wait polls briefly (only where every rank has a core: a
// spinning rank would take the core of the rank it waits for), then sleeps on
// a futex word that publishers bump. Every 100 ms it checks that the peers it
// may be waiting for are alive (kill(pid, 0)), so a peer that died is
// reported within ~100 ms instead of at the timeout.
#pragma once

#include <smp/error.h>

#include "comm/shm_util.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace smp {

// A wait that failed: its message names what was waited for, for how long,
// and the peers that were missing (or the one that exited).
class WaitFailed : public Error {
 public:
  enum class Why { kTimeout, kPeerExited, kStopped };
  WaitFailed(Why why, const std::string& message) : Error(message), why_(why) {}
  Why why() const { return why_; }
  bool timed_out() const { return why_ == Why::kTimeout; }

  // The messages, in one place: "timed out after <ms> ms waiting for <what>;
  // missing: <label>(s) <list>" and "<label> <rank> (pid <pid>) exited while
  // this rank waited for <what>".
  static WaitFailed timeout(std::string_view what, std::chrono::milliseconds waited, std::string_view label,
                            const std::vector<int>& missing);
  static WaitFailed peer_exited(std::string_view what, std::string_view label, int rank, int pid);

 private:
  Why why_;
};

namespace shm {

// A segment's wake-up word: publishers bump `futex` and wake the sleepers;
// `sleepers` counts the waiters inside futex_wait, so that a publisher skips
// the wake-up syscall when nobody sleeps. Lives in shared memory (lock-free
// atomics only).
struct WakeWord {
  std::atomic<uint32_t> futex;
  std::atomic<uint32_t> sleepers;
};

// After publishing: wakes whoever sleeps on w.
void notify(WakeWord& w);

// A peer a wait may be held up by: its group rank and pid (pid <= 0: unknown,
// not checked for being alive).
struct Peer {
  int rank = 0;
  int pid = 0;
};

// Set up on every wait of a collective: nothing here allocates (the texts are
// views of strings that outlive the wait; the lambdas capture references).
struct WaitFor {
  WakeWord* word = nullptr;
  int spins = 0;  // polls before the first sleep (shm::spins_for_this_host)
  std::chrono::milliseconds timeout{0};
  // What is waited for, for the failure ("a shared-memory all-reduce", "its message (tag 2)").
  std::string_view what;
  // The peers the wait may be held up by now: checked for being alive, named on a timeout.
  std::function<std::vector<Peer>()> missing;
  // When set: the wait fails (kStopped) with "<stop_reason> while this rank waited for <what>".
  const std::atomic<bool>* stop = nullptr;
  std::string_view stop_reason;
};

// The slow part of wait_until: sleeps on w.word until reached(); throws
// WaitFailed on a timeout, a missing peer that exited, or stop.
void sleep_until(const WaitFor& w, const std::function<bool()>& reached);

// Returns once reached() is true (reached() may act: a receive takes its
// message in it). Polls w.spins times first, inline (no call per poll).
template <class Reached>
void wait_until(const WaitFor& w, Reached&& reached) {
  for (int i = 0; i < w.spins; ++i) {
    if (reached()) return;
    cpu_relax();
  }
  sleep_until(w, std::function<bool()>(std::ref(reached)));
}

}  // namespace shm
}  // namespace smp
