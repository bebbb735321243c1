#include "heartbeat.h"

#include <smp/process_env.h>

#include <cstdio>
#include <string>

namespace smp {

Heartbeat::Heartbeat(double hang_timeout_s) {
  char line[64];
  std::snprintf(line, sizeof line, "timeout %g", hang_timeout_s);
  notify_launcher(line);
}

Heartbeat& process_heartbeat(double hang_timeout_s) {
  static Heartbeat heartbeat(hang_timeout_s);
  return heartbeat;
}

void Heartbeat::beat() { notify_launcher("beat"); }

void Heartbeat::step(int64_t done) { notify_launcher("step " + std::to_string(done)); }

}  // namespace smp
