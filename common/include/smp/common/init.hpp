// Parameter initialisation that never needs the full tensor: a counter-based
// normal generator. Element i of a full tensor (its row-major index) is a
// function of (seed, stream, i) alone (splitmix64 bits, Box-Muller), so a rank
// can generate just its shard, any slice along one dimension, and get exactly
// the values of that slice of the full tensor: the same model for every layout
// without ever materialising what the rank does not keep (delayed
// initialisation). A module draws its tensors from one InitStream in a fixed
// order; each draw is its own stream.
//
// Deferred init (ABI 2.2, SMP_MEMORY_FEATURE_DEFERRED_INIT): while a
// DeferredInit scope is open on the thread (the SDK opens one around a module's
// constructor when the host asks), InitStream returns tensors without storage
// and records how to fill them (an InitSpec); the host then fills only the part
// it keeps, e.g. a ZeRO-3 dp shard, with fill_init() — the same values.
#pragma once

#include <smp/common/splitmix.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
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

// How a parameter is drawn: the values of the C ABI's smp_param_init_kind
// (SMP_PARAM_INIT_NORMAL, SMP_PARAM_INIT_CONSTANT; smp/sdk/init.hpp checks
// they agree), held as an int so that this header, shared by the core and the
// SDK, needs no ABI header. It converts from and to those constants.
struct InitKind {
  static constexpr int kNormal = 0, kConstant = 1;
  int value = kConstant;
  constexpr InitKind() = default;
  constexpr InitKind(int v) : value(v) {}  // NOLINT: implicit, from the ABI's constants
  constexpr operator int() const { return value; }
};

// How one parameter gets its values (smp_param_init in C++).
struct InitSpec {
  InitKind kind = InitKind::kConstant;
  uint64_t key = 0;    // NORMAL: the draw's generator key
  double value = 0;    // NORMAL: the standard deviation; CONSTANT: the value
  std::vector<int64_t> full;  // the full tensor's shape (all tp ranks together)
  Slice slice;                // the part this tensor is

  // The tensor's own shape: full with the slice's length along its dim.
  std::vector<int64_t> shape() const {
    std::vector<int64_t> s = full;
    if (slice.dim >= 0) s[static_cast<size_t>(slice.dim)] = slice.length;
    return s;
  }
};

namespace detail {
// A standard normal for full-tensor element `index` of a stream.
inline double counter_normal(uint64_t key, uint64_t index) {
  const uint64_t a = splitmix64(key ^ (2 * index)), b = splitmix64(key ^ (2 * index + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace detail
class DeferredInit;
namespace detail {
// The open deferred-init record of this thread (null: none).
inline DeferredInit*& deferred_init_target() {
  thread_local DeferredInit* target = nullptr;
  return target;
}

// A tensor with sizes and dtype but a 0-byte storage (what ZeRO-3 leaves of a released parameter).
inline at::Tensor storageless(at::IntArrayRef shape, const at::TensorOptions& options) {
  at::Tensor t = at::empty({0}, options);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return t;
}
}  // namespace detail

// Whether a tensor has elements but no storage yet: a deferred-init draw not
// filled (or a ZeRO-3 parameter between uses).
inline bool lacks_storage(const at::Tensor& t) { return t.numel() > 0 && t.storage().nbytes() == 0; }

// Elements [first, first + count) (row-major, of the tensor `spec` describes) into out (fp32).
inline void fill_init(const InitSpec& spec, int64_t first, int64_t count, float* out) {
  if (spec.kind == InitKind::kConstant) {
    std::fill(out, out + count, static_cast<float>(spec.value));
    return;
  }
  int64_t inner = 1, extent = 1, begin = 0, length = 1;
  if (spec.slice.dim >= 0) {
    for (size_t d = static_cast<size_t>(spec.slice.dim) + 1; d < spec.full.size(); ++d) inner *= spec.full[d];
    extent = spec.full[static_cast<size_t>(spec.slice.dim)];
    begin = spec.slice.begin;
    length = spec.slice.length;
  }
  // Local element j = (o, m, i) (outer, position in the slice, inner) is full
  // element ((o * extent) + begin + m) * inner + i.
  at::parallel_for(first, first + count, 4096, [&](int64_t lo, int64_t hi) {
    for (int64_t j = lo; j < hi; ++j) {
      int64_t full_index = j;
      if (spec.slice.dim >= 0) {
        const int64_t i = j % inner, row = j / inner, o = row / length, m = row % length;
        full_index = (o * extent + begin + m) * inner + i;
      }
      out[j - first] =
          static_cast<float>(spec.value * detail::counter_normal(spec.key, static_cast<uint64_t>(full_index)));
    }
  });
}

// The whole tensor `spec` describes (fp32, CPU).
inline at::Tensor materialise_init(const InitSpec& spec) {
  at::Tensor out = at::empty(spec.shape(), at::kFloat);
  fill_init(spec, 0, out.numel(), out.data_ptr<float>());
  return out;
}

// What a module's constructor drew while deferred, by tensor.
class DeferredInit {
 public:
  void record(const at::Tensor& t, InitSpec spec) { specs_[t.unsafeGetTensorImpl()] = std::move(spec); }
  // The spec of a tensor still without storage, else null.
  const InitSpec* find(const at::Tensor& t) const {
    auto it = specs_.find(t.unsafeGetTensorImpl());
    return it != specs_.end() && t.storage().nbytes() == 0 ? &it->second : nullptr;
  }

 private:
  std::map<const c10::TensorImpl*, InitSpec> specs_;
};

// Opens `target` as this thread's deferred-init record for the scope's life.
class DeferredInitScope {
 public:
  explicit DeferredInitScope(DeferredInit* target) : saved_(detail::deferred_init_target()) {
    detail::deferred_init_target() = target;
  }
  ~DeferredInitScope() { detail::deferred_init_target() = saved_; }
  DeferredInitScope(const DeferredInitScope&) = delete;
  DeferredInitScope& operator=(const DeferredInitScope&) = delete;

 private:
  DeferredInit* saved_;
};

// A tensor of `shape` filled with `value` (fp32, CPU; storage-less when deferred). Draws nothing.
inline at::Tensor init_constant(at::IntArrayRef shape, double value) {
  InitSpec spec;
  spec.kind = InitKind::kConstant;
  spec.value = value;
  spec.full = shape.vec();
  if (DeferredInit* d = detail::deferred_init_target()) {
    at::Tensor t = detail::storageless(shape, at::kFloat);
    d->record(t, std::move(spec));
    return t;
  }
  return at::full(shape, value, at::kFloat);
}

class InitStream {
 public:
  explicit InitStream(uint64_t seed) : seed_(seed) {}

  // The next draw: N(0, std) over `full`, only `slice` of it generated (fp32,
  // CPU; storage-less when deferred).
  at::Tensor normal(at::IntArrayRef full, double std, Slice slice = Slice::all()) {
    InitSpec spec;
    spec.kind = InitKind::kNormal;
    spec.key = detail::splitmix64(seed_ ^ detail::splitmix64(stream_++));
    spec.value = std;
    spec.full = full.vec();
    spec.slice = slice;
    if (DeferredInit* d = detail::deferred_init_target()) {
      at::Tensor t = detail::storageless(spec.shape(), at::kFloat);
      d->record(t, std::move(spec));
      return t;
    }
    return materialise_init(spec);
  }

 private:
  uint64_t seed_;
  uint64_t stream_ = 0;
};

}  // namespace smp::sdk
