#include "comm/store_wait.h"

#include "comm/c10d_compat.h"
#include "comm/wait.h"

#include <thread>
#include <vector>

namespace smp {

void arrive(c10d_compat::Store& store, const std::string& key, int party) {
  // The mark first: a waiter that sees the count complete never lists this party.
  store.set(key + "/" + std::to_string(party), "1");
  store.add(key, 1);
}

void wait_for_arrivals(c10d_compat::Store& store, const std::string& key, int parties,
                       std::chrono::milliseconds timeout, const std::string& what, const std::string& label) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  while (store.add(key, 0) < parties) {
    const auto waited = Clock::now() - start;
    if (waited >= timeout) {
      std::vector<int> missing;
      for (int p = 0; p < parties; ++p)
        if (!store.check(key + "/" + std::to_string(p))) missing.push_back(p);
      throw WaitFailed::timeout(what, timeout, label, missing);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(waited < std::chrono::milliseconds(100) ? 1 : 10));
  }
}

}  // namespace smp
