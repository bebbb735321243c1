// Activation offloading (memory.offload, SMP's offload_activations): the
// inputs a checkpointed node keeps for its backward leave the device for host
// memory right after the forward, and come back ahead of the backward that
// needs them — `horizon` backward passes ahead (SMP's
// activation_loading_horizon), so the copy overlaps the backward passes before.
//
// On CUDA the copies run on two side streams (device→pinned host, host→device)
// ordered against the compute stream by events; a source's memory goes back to
// the caching allocator once its copy is done (recordStream). Any other device
// copies synchronously — the mechanism the unit test checks on the CPU (the job
// config refuses memory.offload there: the activations are already in host memory).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

namespace smp::sdk {
struct InputStash;  // smp/sdk/checkpoint.hpp
}

namespace smp {

class ActivationOffload {
 public:
  ActivationOffload(c10::Device device, int horizon);
  ~ActivationOffload();
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  int horizon() const { return horizon_; }

  // What checkpointed calls of slot (microbatch, chunk) keep their inputs in.
  sdk::InputStash* stash(int microbatch, int chunk);
  // Starts loading the slot's stashed inputs back to the device (idempotent).
  void prefetch(int microbatch, int chunk);
  // Drops every slot (the end of a step; backward has consumed what it needs).
  void clear();

  // Bytes in host memory now, and the most at once since the last clear().
  int64_t host_bytes() const { return host_bytes_; }
  int64_t host_peak_bytes() const { return host_peak_; }
  // Tensors offloaded since construction (for tests and the log).
  int64_t offloaded() const { return offloaded_; }

 private:
  struct Entry;
  struct SlotStash;
  struct Streams;  // CUDA only
  std::shared_ptr<Entry> offload(const at::Tensor& t);
  void load(Entry& e);
  at::Tensor give_back(Entry& e);

  c10::Device device_;
  int horizon_;
  std::unique_ptr<Streams> streams_;
  std::map<std::pair<int, int>, std::unique_ptr<SlotStash>> slots_;
  int64_t host_bytes_ = 0, host_peak_ = 0, offloaded_ = 0;
};

}  // namespace smp
