// A step's phase boundaries on the host's clock and, on a CUDA device, on the
// device's: at each boundary a CUDA event is recorded on the device's current
// stream (the compute stream), and the events are read once the step's last
// phase has ended. The host clock says when the host got past a phase (which
// on a GPU may be long before or after its kernels ran: a `.item()` waits for
// all the work queued before it); the device clock how long the stream took
// between the boundaries. On the CPU, or without CUDA compiled in, there is
// no device clock and the device seconds are absent (NaN here, left out of
// reports), never copied from the host's.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace smp {

class PhaseClock {
 public:
  explicit PhaseClock(const c10::Device& device);
  ~PhaseClock();
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

  // Whether device seconds are taken (a CUDA device in a CUDA build).
  bool on_device() const;
  // The first phase begins now; forgets the phases of the step before.
  void start();
  // The phase begun at the previous boundary ends now: its host seconds.
  double end(const std::string& name);

  struct Phase {
    std::string name;
    double host_s = 0;
    double device_s = 0;  // NaN when !on_device()
    int64_t start_us = 0, end_us = 0;  // trace::now_us's clock
  };
  // The phases ended since start(), with their device seconds (this waits for
  // the last boundary's event), each recorded as a "phase" trace slice whose
  // args carry host_s and, on a device, device_s. Once per start().
  const std::vector<Phase>& finish();

 private:
  struct Events;  // the CUDA events (CUDA builds only)
  c10::Device device_;
  std::unique_ptr<Events> events_;
  std::chrono::steady_clock::time_point last_;
  std::vector<Phase> phases_;
};

}  // namespace smp
