// Progress reports to smp-launch: through the pipe SMP_HEARTBEAT_FD names, the
// rank first says its run.hang_timeout_s, then beats after each step (and
// after loading, saving and validating). smp-launch treats a rank silent for
// longer than that as failed. Without the variable (another launcher) nothing
// is sent.
#pragma once

namespace smp {

class Heartbeat {
 public:
  explicit Heartbeat(double hang_timeout_s);
  ~Heartbeat() = default;  // the inherited descriptor stays open: it is smp-launch's, for the process's life
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  void beat();

 private:
  void send(const char* line);
  int fd_ = -1;
};

// The process's one heartbeat, made by the first call (its timeout holds):
// two Trainers in a row share it, and none closes the descriptor another
// would then write to.
Heartbeat& process_heartbeat(double hang_timeout_s);

}  // namespace smp
