// Gradient reduction after the microbatches of a step, with every group given
// per parameter (synced_parameter derives them from the parameter's placements):
// DDP-style bucketed all-reduce over its data-parallel group (dp, or edp for
// an expert) overlapped with the last backward, sums over the axes where its
// gradient is partial (sequence-parallel norms over tp), and sums across the
// pipeline stages that hold replicas of a tied parameter.
//
// Under ZeRO (GradientSyncOptions::zero >= 1, the memory manager's sharded data
// parallelism) every bucket is padded to a multiple of its data-parallel group
// and each rank owns one contiguous shard of it: stage 1 still all-reduces the
// bucket (only the shard is read afterwards), stages 2 and 3 reduce-scatter it
// into the shard (the bucket's own slice: no second gradient buffer). Either way the reduction happens once per step, after the
// last microbatch's backward has accumulated into the full-size bucket: that is
// what lets ZeRO-2/3 combine with pipeline parallelism and gradient
// accumulation (see docs/memory.md).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <utility>
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
  // ZeRO-3: the unit (module) whose parameters are gathered together; buckets
  // never mix units. -1 = none.
  int unit = -1;
};

struct GradientSyncOptions {
  // dp buckets are launched as soon as all their gradients are final; 0
  // disables overlap (one reduction after backward). Ignored between units under ZeRO-3.
  int64_t bucket_bytes = 4 << 20;
  int zero = 0;  // 0: all-reduce; 1: all-reduce, shards read; 2, 3: reduce-scatter into shards
};

// One bucket as laid out in memory, for the sharded parameter side (ZeRO).
struct BucketLayout {
  Communicator* comm = nullptr;  // the data-parallel group; null = a group of one
  std::vector<size_t> params;    // GradientSync parameter indices, in flat order
  std::vector<int64_t> offsets;  // element offset of each in the flat
  std::vector<int64_t> numels;
  int64_t padded = 0;            // flat elements, a multiple of the group size
  int64_t shard = 0;             // elements per rank: padded / group size
  int rank = 0;                  // this rank's shard: [rank * shard, (rank + 1) * shard)
  int unit = -1;
};

// The part of one parameter that falls in this rank's shard of its bucket.
struct ShardSegment {
  size_t param = 0;
  int bucket = 0;
  int64_t param_begin = 0;  // first element, in the parameter's flattened order
  int64_t shard_begin = 0;  // where it sits in the shard
  int64_t length = 0;
};
std::vector<ShardSegment> shard_segments(const std::vector<BucketLayout>& buckets);

// A parameter's reduction groups, from its placements alone: its data-parallel
// group (dp, or edp when it is sharded over ep: an expert) and every axis where
// its gradient is partial. The tied group and expected_grads are the caller's.
SyncedParameter synced_parameter(const at::Tensor& tensor, const Placements& placements, ProcessGroups& groups);

class GradientSync {
 public:
  GradientSync(std::vector<SyncedParameter> params, GradientSyncOptions options);
  GradientSync(std::vector<SyncedParameter> params, int64_t bucket_bytes)
      : GradientSync(std::move(params), GradientSyncOptions{bucket_bytes, 0}) {}
  ~GradientSync();

  // Zeroes every gradient (buckets and main buffers included), in place.
  void begin_step();
  // Waits for / launches the remaining reductions; afterwards every .grad holds
  // the summed gradient. Averaging is left to the optimizer (the loss
  // normaliser's grad scale), which applies it on the fly instead of in
  // another pass over every gradient.
  void finish_step();

  // Parameter k's gradient after finish_step: its main buffer, or its .grad.
  // (ZeRO 0 only: under ZeRO the reduced gradient is segment_gradients'.)
  at::Tensor gradient(size_t k) const;
  size_t size() const { return params_.size(); }

  // ZeRO >= 1: the buckets' layout, and after finish_step the reduced gradient
  // of every shard segment (shard_segments(layout()) order), 1-D views.
  const std::vector<BucketLayout>& layout() const { return layout_; }
  const std::vector<at::Tensor>& segment_gradients() const { return segment_grads_; }
  // ZeRO-3: called with a parameter's unit each time it receives a gradient
  // (ShardedParameters counts them per backward pass and frees the unit).
  void on_unit_gradient(std::function<void(int unit)> f) { unit_gradient_ = std::move(f); }
  // Bytes of the gradient buffers (buckets and unbucketed .grad).
  int64_t bytes() const;

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
  int zero_ = 0;
  std::vector<BucketLayout> layout_;
  std::vector<ShardSegment> segments_;
  std::vector<at::Tensor> segment_grads_;
  std::function<void(int)> unit_gradient_;
  void reduce_beyond_data_parallel(const std::vector<std::pair<const SyncedParameter*, at::Tensor>>& grads);
};

}  // namespace smp
