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
  ~Heartbeat();
  Heartbeat(const Heartbeat&) = delete;
  Heartbeat& operator=(const Heartbeat&) = delete;
  void beat();

 private:
  void send(const char* line);
  int fd_ = -1;
};

}  // namespace smp
