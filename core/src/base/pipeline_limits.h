// What a pipeline message's tag can tell apart, checked at config time
// (Config::validate) and packed by the executor: kind (activation or
// gradient) x microbatch x chunk (virtual stage on the rank) x value, in the
// bits of an int tag. Two messages between a pair of ranks must never share
// a tag, so a job beyond these limits is refused, naming the key.
#pragma once

namespace smp::pipeline_limits {

inline constexpr int kMicrobatches = 4096;  // parallel.microbatches, 12 bits
inline constexpr int kChunks = 16;          // parallel.virtual_stages, 4 bits
inline constexpr int kValues = 63;          // values one stage sends the next, 6 bits (index 0: the header)

// kind 0: activations, 1: gradients.
inline constexpr int tag(int kind, int microbatch, int chunk, int index) {
  return (((kind * kMicrobatches) + microbatch) * kChunks + chunk) * (kValues + 1) + index;
}

}  // namespace smp::pipeline_limits
