// Progress reports to smp-launch: through the pipe SMP_HEARTBEAT_FD names
// (smp::notify_launcher, <smp/process_env.h>), the rank first says its
// run.hang_timeout_s, then beats after each step (and after loading, saving
// and validating). smp-launch treats a rank silent for longer than that as
// failed. Without the variable (another launcher) nothing is sent.
#pragma once

#include <cstdint>

namespace smp {

class Heartbeat {
 public:
  explicit Heartbeat(double hang_timeout_s);
  ~Heartbeat() = default;  // the inherited descriptor stays open: it is smp-launch's, for the process's life
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  void beat();                 // "beat"
  void step(int64_t done);     // "step <done>": the steps done after a training step
};

// The process's one heartbeat, made by the first call (its timeout holds):
// two Trainers in a row share it.
Heartbeat& process_heartbeat(double hang_timeout_s);

}  // namespace smp
