// Module calls draw their random numbers from seeds derived per call
// (seeds.h: derive_seed(train.seed, node, {step, microbatch})), so a dropout
// mask is the same in every layout and when a checkpointed node is recomputed
// in backward. The SDK's torch modules seed the CPU's default generator with
// the call's seed (sdk::SeededGenerator); on a GPU their kernels draw from the
// device's default CUDA generator instead, which this seeds the same way for
// the call and restores afterwards.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

namespace smp {

class SeededDeviceGenerator {
 public:
  // On a CUDA device (in a CUDA build): its default generator gets `seed` (and
  // offset 0) until the scope ends, then its state back. Elsewhere nothing.
  SeededDeviceGenerator(const c10::Device& device, uint64_t seed);
  ~SeededDeviceGenerator();
  SeededDeviceGenerator(const SeededDeviceGenerator&) = delete;
  SeededDeviceGenerator& operator=(const SeededDeviceGenerator&) = delete;

 private:
  at::Generator gen_;  // undefined: nothing seeded
  at::Tensor saved_;   // its state before
};

}  // namespace smp
