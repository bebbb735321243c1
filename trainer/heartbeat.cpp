#include "heartbeat.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace smp {

Heartbeat::Heartbeat(double hang_timeout_s) {
  const char* v = std::getenv("SMP_HEARTBEAT_FD");
  if (!v || !*v) return;
  char* end = nullptr;
  const long fd = std::strtol(v, &end, 10);
  if (*end != '\0' || fd < 0 || ::fcntl(static_cast<int>(fd), F_GETFD) < 0) return;
  fd_ = static_cast<int>(fd);
  // Never block training on a full pipe; a beat that does not fit is dropped.
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  ::fcntl(fd_, F_SETFD, ::fcntl(fd_, F_GETFD) | FD_CLOEXEC);
  char line[64];
  std::snprintf(line, sizeof line, "timeout %g\n", hang_timeout_s);
  send(line);
}

Heartbeat& process_heartbeat(double hang_timeout_s) {
  static Heartbeat heartbeat(hang_timeout_s);
  return heartbeat;
}

void Heartbeat::beat() { send("beat\n"); }

void Heartbeat::send(const char* line) {
  if (fd_ < 0) return;
  const ssize_t n = ::write(fd_, line, std::strlen(line));
  (void)n;
}

}  // namespace smp
