// Every seed the core derives from the job's train.seed, in one function, so
// they are the same for every parallel layout:
//   module init      derive_seed(seed, module_key)
//   a module call    derive_seed(seed, node_name, {step, microbatch})  (dropout masks)
//   the data         the adapter gets train.seed itself and derives per sample
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace smp {

inline uint64_t derive_seed(uint64_t seed, const std::string& name, std::initializer_list<int64_t> indices = {}) {
  uint64_t h = 1469598103934665603ULL ^ seed;  // FNV-1a over the name
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  for (int64_t i : indices) {  // then each index, mixed in (boost::hash_combine's constant)
    h ^= static_cast<uint64_t>(i) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    h *= 1099511628211ULL;
  }
  return h & 0x7fffffffffffffffULL;
}

}  // namespace smp
