// The parameter side of sharded data parallelism (ZeRO), over GradientSync's
// bucket layout: each rank owns one contiguous shard of every bucket.
//   stage 1, 2: parameters stay whole (views into one flat buffer per bucket);
//               the optimizer updates this rank's shard (its fp32 master under
//               mixed precision), then the shards are all-gathered.
//   stage 3:    only the shard is kept; a unit's (module's) parameters are
//               all-gathered just before use and freed after (acquire /
//               release). The parameters keep their shape and storage object:
//               freeing empties the storage, gathering points it at the
//               gathered buffer, so tensors autograd saved in forward (the
//               parameter, its views) see the values again in backward.
#pragma once

#include "memory/gradient_sync.h"

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace smp::sdk {
struct InitSpec;  // smp/sdk/init.hpp
}

namespace smp {

class Work;

// Mixed precision under ZeRO: the parameters become `dtype` in place; returns
// their fp32 values (to cut the masters from), undefined for a parameter
// without storage yet (deferred init: its shard is generated in fp32).
std::vector<at::Tensor> cast_keeping_fp32(std::vector<at::Tensor>& params, at::ScalarType dtype);

class ShardedParameters {
 public:
  // params: GradientSync's parameters by index (already in the compute dtype);
  // fp32_values: their fp32 values when that dtype is 16-bit (the masters are
  // taken from them), else empty. units: ZeRO-3 unit names (module keys) by id.
  // inits: empty, or per parameter its initialiser when it was created without
  // storage (deferred init, stage 3 only): only this rank's shard of it is
  // ever generated.
  ShardedParameters(std::vector<at::Tensor> params, const std::vector<at::Tensor>& fp32_values,
                    std::vector<BucketLayout> layout, int stage, std::vector<std::string> units,
                    const std::vector<std::shared_ptr<const sdk::InitSpec>>& inits = {});
  ~ShardedParameters();

  // What the optimizer updates: one 1-D tensor per shard segment (the order of
  // shard_segments(layout)), fp32.
  const std::vector<at::Tensor>& optimizer_params() const { return optimizer_params_; }
  // This rank's shard of the parameters in the compute dtype, a 1-D view per
  // shard segment in the same order (what stage 3 keeps between steps).
  const std::vector<at::Tensor>& parameter_segments() const { return parameter_segments_; }
  // Whether optimizer_params are fp32 masters apart from the parameters (16-bit compute).
  bool has_masters() const { return has_masters_; }
  // After the optimizer step: masters into the compute-dtype shards, then
  // stages 1-2 all-gather the buckets and stage 3 frees every gathered unit.
  void after_step();

  // ZeRO-3 (no-ops otherwise, and for names without trainable parameters).
  void acquire(const std::string& unit);   // gathered on return
  void prefetch(const std::string& unit);  // starts the gather
  void release(const std::string& unit);
  void release(int unit);
  void acquire_all();  // e.g. to read every parameter at the end of a run
  void release_all();

  // ZeRO-3 in backward: a unit's gathered parameters are freed as soon as each
  // has its gradient in the current backward pass (GradientSync reports every
  // gradient). The counts start afresh with each pass; a pass that ends with a
  // unit partly counted (a parameter that got no gradient in it: a branch not
  // taken, an expert no token chose) frees that unit then, so no count is
  // carried into a later pass, where it would free the unit too early.
  void begin_backward_pass();
  void gradient_arrived(int unit);
  void end_backward_pass();

  // Bytes held now: the parameters' buffers (whole, shards, gathered) and the fp32 masters.
  int64_t parameter_bytes() const;
  int64_t master_bytes() const;

 private:
  struct Bucket;
  void start_gather(Bucket& b);
  void bind(Bucket& b);
  void unbind(Bucket& b);

  std::vector<at::Tensor> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<at::Tensor> optimizer_params_, parameter_segments_;
  bool has_masters_ = false;
  std::map<std::string, int> unit_id_;
  std::vector<std::vector<int>> buckets_of_unit_;
  std::vector<int> unit_params_, unit_seen_;  // per unit: parameters, and those with a gradient in this pass
  int stage_;
};

}  // namespace smp
