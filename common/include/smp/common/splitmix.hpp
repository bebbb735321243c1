// SplitMix64's finaliser: the SDK's counter-based streams (init.hpp) and the
// adapters' data seeds and shuffles. A header of its own, without LibTorch.
#pragma once

#include <cstdint>

namespace smp::sdk::detail {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace smp::sdk::detail
