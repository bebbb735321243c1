#include "base/phase_clock.h"

#include "base/trace.h"

#ifdef SMP_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include <cmath>
#include <limits>

namespace smp {

#ifdef SMP_WITH_CUDA
// One timing event per boundary (slot 0: the start), reused step after step.
struct PhaseClock::Events {
  std::vector<at::cuda::CUDAEvent> slots;
  void record(const c10::Device& device, size_t slot) {
    c10::cuda::CUDAGuard guard(device.index());
    while (slots.size() <= slot) slots.emplace_back(cudaEventDefault);  // timing on (the default disables it)
    slots[slot].record(at::cuda::getCurrentCUDAStream(device.index()));
  }
  // Seconds between two recorded slots, once the later one has happened.
  double seconds(const c10::Device& device, size_t from, size_t to) {
    c10::cuda::CUDAGuard guard(device.index());
    slots[to].synchronize();
    return static_cast<double>(slots[from].elapsed_time(slots[to])) / 1e3;
  }
};
#else
struct PhaseClock::Events {
  void record(const c10::Device&, size_t) {}
  double seconds(const c10::Device&, size_t, size_t) { return std::numeric_limits<double>::quiet_NaN(); }
};
#endif

namespace {

int64_t micros(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

PhaseClock::PhaseClock(const c10::Device& device) : device_(device) {
#ifdef SMP_WITH_CUDA
  if (device.is_cuda()) events_ = std::make_unique<Events>();
#endif
}

PhaseClock::~PhaseClock() = default;

bool PhaseClock::on_device() const { return events_ != nullptr; }

void PhaseClock::start() {
  phases_.clear();
  if (events_) events_->record(device_, 0);
  last_ = std::chrono::steady_clock::now();
}

double PhaseClock::end(const std::string& name) {
  if (events_) events_->record(device_, phases_.size() + 1);
  const auto now = std::chrono::steady_clock::now();
  Phase p;
  p.name = name;
  p.host_s = std::chrono::duration<double>(now - last_).count();
  p.device_s = std::numeric_limits<double>::quiet_NaN();
  p.start_us = micros(last_);
  p.end_us = micros(now);
  phases_.push_back(p);
  last_ = now;
  return p.host_s;
}

const std::vector<PhaseClock::Phase>& PhaseClock::finish() {
  for (size_t k = 0; k < phases_.size(); ++k) {
    Phase& p = phases_[k];
    if (events_) p.device_s = events_->seconds(device_, k, k + 1);
    trace::Args args{{"host_s", p.host_s}};
    if (!std::isnan(p.device_s)) args.emplace_back("device_s", p.device_s);
    trace::complete("phase", p.name, p.start_us, p.end_us, std::move(args));
  }
  return phases_;
}

}  // namespace smp
