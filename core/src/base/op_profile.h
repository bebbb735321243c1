// Op-level profile (run.profile_ops): a RecordFunction observer (what
// LibTorch's profiler is built on) over the steps run.trace_steps names, on the
// rank's training thread. Every ATen
// op and autograd node it runs is summed by name (calls, self and total CPU
// time), so a step can be compared op by op with a PyTorch-eager step of the
// same model (bench/eager_gpt.py --profile-ops writes the same format).
#pragma once

#include <smp/tracing.h>

#include <cstdint>
#include <string>

namespace smp::op_profile {

// configure and write_rank_file: <smp/tracing.h>.

// Records the ops of one training step when it is in the window.
class StepScope {
 public:
  explicit StepScope(int64_t step);
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  bool recording_ = false;
  uint64_t handle_ = 0;  // at::CallbackHandle
};


}  // namespace smp::op_profile
