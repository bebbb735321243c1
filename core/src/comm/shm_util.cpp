#include "comm/shm_util.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
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

NewSegment create_segment(const std::string& stem, size_t bytes, const std::string& what_for) {
  static std::atomic<uint64_t> counter{0};
  NewSegment s;
  for (int attempt = 0; attempt < 64; ++attempt) {
    s.name = "/smp-" + std::to_string(getpid()) + "-" + stem + std::to_string(counter++);
    s.fd = shm_open(s.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (s.fd >= 0 || errno != EEXIST) break;
  }
  if (s.fd < 0) {
    s.error = "shm_open(" + s.name + "): " + std::strerror(errno);
    return s;
  }
  if (ftruncate(s.fd, static_cast<off_t>(bytes)) != 0) {
    s.error = std::string("ftruncate: ") + std::strerror(errno);
  } else if (int rc = posix_fallocate(s.fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    s.error = "could not reserve " + std::to_string(bytes >> 20) + " MiB in /dev/shm" + what_for + " (" +
              std::strerror(rc) +
              "); give /dev/shm more room (docker: --shm-size), lower comm.shm_mb, or set comm.shm_mb = 0 to use Gloo";
  }
  if (!s.error.empty()) {
    close(s.fd);
    shm_unlink(s.name.c_str());
    s.fd = -1;
  }
  return s;
}

Mapped map_and_close(int fd, size_t bytes, const std::string& name) {
  Mapped m;
  struct stat st {};
  if (bytes == 0 && fstat(fd, &st) != 0) {
    m.error = "fstat of " + name + ": " + std::strerror(errno);
    close(fd);
    return m;
  }
  m.bytes = bytes > 0 ? bytes : static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, m.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int mmap_errno = errno;
  close(fd);
  if (base == MAP_FAILED)
    m.error = "mmap of " + std::to_string(m.bytes) + " bytes of " + name + ": " + std::strerror(mmap_errno);
  else
    m.base = static_cast<char*>(base);
  return m;
}

Mapped open_published(const std::string& published, size_t bytes, int creator, const std::string& what) {
  const std::string who = "group rank " + std::to_string(creator);
  if (!published.empty() && published[0] == '!') return {nullptr, 0, who + " could not create " + what + ": " + published.substr(1)};
  const int fd = shm_open(published.c_str(), O_RDWR, 0600);
  if (fd < 0) return {nullptr, 0, "shm_open(" + published + ") made by " + who + ": " + std::strerror(errno)};
  Mapped m = map_and_close(fd, bytes, published);
  if (!m.base) m.error += " (" + what + ", made by " + who + ")";
  return m;
}

}  // namespace smp::shm
