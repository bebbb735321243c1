// Gradient reduction after the microbatches of a step, with every group given
// per parameter (synced_parameter derives them from the parameter's placements):
// DDP-style bucketed all-reduce over its data-parallel group (dp, or edp for
// an expert) overlapped with the last backward, sums over the axes where its
// gradient is partial (sequence-parallel norms over tp), and sums across the
// pipeline stages that hold replicas of a tied parameter.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace smp {

class Communicator;
class Placements;
class ProcessGroups;
class Work;

struct SyncedParameter {
  at::Tensor tensor;
  int expected_grads = 1;             // AccumulateGrad calls per step (microbatches x uses on this rank)
  Communicator* data_parallel = nullptr;  // summed over (bucketed, overlapped); null or size 1: none
  std::vector<Communicator*> partial;     // then summed over each of these (partial-gradient axes)
  Communicator* tied = nullptr;       // then over the stages holding replicas of a tied parameter
  // The dtype gradients are accumulated and reduced in (train.grad_reduce_dtype);
  // Undefined = the parameter's. When it differs (bf16 parameters, fp32
  // gradients), the gradient lives in a separate "main" buffer that each
  // backward's .grad is added into (Megatron's main_grad).
  at::ScalarType grad_dtype = at::ScalarType::Undefined;
};

// A parameter's reduction groups, from its placements alone: its data-parallel
// group (dp, or edp when it is sharded over ep: an expert) and every axis where
// its gradient is partial. The tied group and expected_grads are the caller's.
SyncedParameter synced_parameter(const at::Tensor& tensor, const Placements& placements, ProcessGroups& groups);

class GradientSync {
 public:
  // bucket_bytes: dp buckets are launched as soon as all their gradients are
  // final; 0 disables overlap (one reduction after backward).
  GradientSync(std::vector<SyncedParameter> params, int64_t bucket_bytes);
  ~GradientSync();

  // Zeroes every gradient (buckets and main buffers included), in place.
  void begin_step();
  // Waits for / launches the remaining reductions; afterwards every .grad holds
  // the summed gradient. Averaging is left to the optimizer (the loss
  // normaliser's grad scale), which applies it on the fly instead of in
  // another pass over every gradient.
  void finish_step();

  // Parameter k's gradient after finish_step: its main buffer, or its .grad.
  at::Tensor gradient(size_t k) const;
  size_t size() const { return params_.size(); }

 private:
  struct Bucket;
  struct Hook;
  void on_grad(size_t param);
  void launch_ready();
  void launch(Bucket& b);
  void check_view(size_t param, const Bucket& b) const;

  std::vector<SyncedParameter> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;  // in launch order
  std::vector<int> bucket_of_;
  std::vector<at::Tensor> main_;  // main gradient buffers (views into buckets); undefined = .grad
  std::vector<int> seen_;
  std::vector<std::shared_ptr<void>> accumulators_;  // the hooked AccumulateGrad nodes, kept alive
  size_t next_launch_ = 0;
  bool overlap_ = true;
};

}  // namespace smp
