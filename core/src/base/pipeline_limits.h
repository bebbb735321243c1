// What a pipeline message's tag can tell apart, checked at config time
// (Config::validate) and packed by the executor: kind (activation or
// gradient) x microbatch x chunk (virtual stage on the rank) x value, in the
// bits of an int tag. Two messages between a pair of ranks must never share
// a tag, so a job beyond these limits is refused, naming the key.
#pragma once

#include <string>

namespace smp::pipeline_limits {

inline constexpr int kMicrobatches = 4096;  // parallel.microbatches, 12 bits
inline constexpr int kChunks = 16;          // parallel.virtual_stages, 4 bits
inline constexpr int kValues = 63;          // values one stage sends the next, 6 bits (index 0: the header)

// kind 0: activations, 1: gradients.
inline constexpr int tag(int kind, int microbatch, int chunk, int index) {
  return (((kind * kMicrobatches) + microbatch) * kChunks + chunk) * (kValues + 1) + index;
}

// What a tag carries, for messages: "activations of microbatch 3, chunk 1 (value 2)".
inline std::string describe(int t) {
  if (t < 0 || t >= tag(2, 0, 0, 0)) return "";
  const int index = t % (kValues + 1), chunk = t / (kValues + 1) % kChunks;
  const int microbatch = t / (kValues + 1) / kChunks % kMicrobatches, kind = t / (kValues + 1) / kChunks / kMicrobatches;
  return std::string(kind == 0 ? "activations" : "gradient") + " of microbatch " + std::to_string(microbatch) +
         ", chunk " + std::to_string(chunk) +
         (kind == 0 && index == 0 ? " (header)" : " (value " + std::to_string(index) + ")");
}

}  // namespace smp::pipeline_limits
