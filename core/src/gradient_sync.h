// Gradient reduction after the microbatches of a step: DDP-style bucketed dp
// all-reduce overlapped with the last backward, sums over tp for parameters
// whose replicas get different gradients (sequence-parallel norms), and sums
// across the pipeline stages that hold replicas of a tied parameter.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace smp {

class Communicator;
class Work;

struct SyncedParameter {
  at::Tensor tensor;
  int expected_grads = 1;            // AccumulateGrad calls per step (microbatches x uses on this rank)
  bool tp_grad_sum = false;
  Communicator* tied = nullptr;      // stages holding replicas of a tied parameter
};

class GradientSync {
 public:
  // bucket_bytes: dp buckets are launched as soon as all their gradients are
  // final; 0 disables overlap (one reduction after backward).
  GradientSync(std::vector<SyncedParameter> params, Communicator* dp, Communicator* tp, int64_t bucket_bytes);
  ~GradientSync();

  void begin_step();
  // Waits for / launches the remaining reductions; afterwards every .grad holds
  // the dp-summed, tp-summed, tie-summed gradient. The dp average is left to
  // the optimizer (grad_scale()), which applies it on the fly instead of in
  // another pass over every gradient.
  void finish_step();
  double grad_scale() const;  // 1 / dp

 private:
  struct Bucket;
  struct Hook;
  void on_grad(size_t param);
  void launch_ready();
  void launch(Bucket& b);
  void check_view(size_t param, const Bucket& b) const;

  std::vector<SyncedParameter> params_;
  Communicator* dp_;
  Communicator* tp_;
  std::vector<std::unique_ptr<Bucket>> buckets_;  // in launch order
  std::vector<int> bucket_of_;
  std::vector<int> seen_;
  size_t next_launch_ = 0;
  bool overlap_ = true;
};

}  // namespace smp
