// Parameter initialisation that never needs the full tensor: a counter-based
// normal generator. Element i of a full tensor (its row-major index) is a
// function of (seed, stream, i) alone (splitmix64 bits, Box-Muller), so a rank
// can generate just its shard, any slice along one dimension, and get exactly
// the values of that slice of the full tensor: the same model for every layout
// without ever materialising what the rank does not keep (delayed
// initialisation). A module draws its tensors from one InitStream in a fixed
// order; each draw is its own stream.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace smp::sdk {

// The part of a full tensor to generate: [begin, begin + length) along dim (dim -1: all of it).
struct Slice {
  int64_t dim = -1, begin = 0, length = 0;
  static Slice all() { return {}; }
  // Part `rank` of `size` equal parts along dim (the size must divide).
  static Slice part(int64_t dim, int64_t extent, int rank, int size) {
    return {dim, extent / size * rank, extent / size};
  }
};

namespace detail {
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// A standard normal for full-tensor element `index` of a stream.
inline double counter_normal(uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(key ^ (2 * index)), b = splitmix64(key ^ (2 * index + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}
}  // namespace detail

class InitStream {
 public:
  explicit InitStream(uint64_t seed) : seed_(seed) {}

  // The next draw: N(0, std) over `full`, only `slice` of it generated (fp32, CPU).
  at::Tensor normal(at::IntArrayRef full, double std, Slice slice = Slice::all()) {
    const uint64_t key = detail::splitmix64(seed_ ^ detail::splitmix64(stream_++));
    std::vector<int64_t> shape = full.vec();
    int64_t outer = 1, inner = 1, extent = 1, begin = 0, length = 1;
    if (slice.dim >= 0) {
      for (int64_t d = 0; d < slice.dim; ++d) outer *= full[d];
      for (size_t d = static_cast<size_t>(slice.dim) + 1; d < full.size(); ++d) inner *= full[d];
      extent = full[slice.dim];
      begin = slice.begin;
      length = slice.length;
      shape[slice.dim] = length;
    } else {
      for (int64_t s : full) inner *= s;
    }
    at::Tensor out = at::empty(shape, at::kFloat);
    float* data = out.data_ptr<float>();
    // Output row r = (o, m): full index ((o * extent) + begin + m) * inner + i.
    at::parallel_for(0, outer * length, 1, [&](int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        const int64_t o = r / length, m = r % length;
        const uint64_t base = static_cast<uint64_t>((o * extent + begin + m) * inner);
        for (int64_t i = 0; i < inner; ++i)
          data[r * inner + i] = static_cast<float>(std * detail::counter_normal(key, base + static_cast<uint64_t>(i)));
      }
    });
    return out;
  }

 private:
  uint64_t seed_;
  uint64_t stream_ = 0;
};

}  // namespace smp::sdk
