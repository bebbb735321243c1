#include "comm/shm_util.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <ctime>
#include <fstream>

namespace smp::shm {

std::string host_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat ns {}, dev {};
  if (boot.empty() || stat("/proc/self/ns/pid", &ns) != 0 || stat("/dev/shm", &dev) != 0) return "";
  return boot + "/" + std::to_string(ns.st_ino) + "/" + std::to_string(dev.st_dev);
}

int spins_for_this_host(int group_size) {
  constexpr int kSpins = 4000;
  int ranks_here = group_size;
  if (const char* v = std::getenv("LOCAL_WORLD_SIZE")) ranks_here = std::max(ranks_here, std::atoi(v));
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return ranks_here <= cores ? kSpins : 0;
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, long nanoseconds) {
  timespec ts{0, nanoseconds};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace smp::shm
