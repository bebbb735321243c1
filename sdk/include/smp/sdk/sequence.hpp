// A sequence split over a sequence axis (parallel.cp): which tokens of every
// sample a coordinate holds. The load balance of Megatron's context
// parallelism and torch.distributed's context_parallel ("head-tail"): the
// sequence is cut into 2 n equal chunks and coordinate r holds chunks r and
// 2 n - 1 - r, in that order, so that every coordinate's share of a causal
// mask's work is the same. Adapters cut their samples with it (BatchRequest's
// sequence share) and kinds find the global positions of their tokens.
#pragma once

#include <smp/sdk/host.hpp>

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace smp::sdk {

// One coordinate of a sequence axis: index of size (0 of 1: not split).
struct SequenceShare {
  std::string axis;  // empty when the job has no sequence axis
  int index = 0, size = 1;
  bool split() const { return size > 1; }
};

// The global positions coordinate `rank` of `cp` holds of a sequence of `seq`
// tokens (int64, on the CPU). `key` names the setting in messages: a sequence
// that does not cut into 2 cp chunks is refused.
inline at::Tensor context_parallel_positions(int64_t seq, int64_t cp, int64_t rank, const std::string& key) {
  if (cp < 1 || rank < 0 || rank >= cp)
    throw Error(key + ": rank " + std::to_string(rank) + " of " + std::to_string(cp) + " is not a rank");
  if (seq % (2 * cp) != 0)
    throw Error(key + " = " + std::to_string(cp) + ": the sequence of " + std::to_string(seq) +
                " tokens does not cut into 2 x " + std::to_string(cp) + " = " + std::to_string(2 * cp) +
                " equal chunks (the causal load balance needs seq_len % (2 cp) == 0)");
  const int64_t chunk = seq / (2 * cp);
  return at::cat({at::arange(rank * chunk, (rank + 1) * chunk, at::kLong),
                  at::arange((2 * cp - 1 - rank) * chunk, (2 * cp - rank) * chunk, at::kLong)});
}

// This share of `t` along `dim` (t's full sequence there): a copy of the
// share's tokens; t itself when the sequence is not split.
inline at::Tensor sequence_share_of(const at::Tensor& t, int64_t dim, const SequenceShare& share,
                                    const std::string& key) {
  if (!share.split()) return t;
  const at::Tensor pos = context_parallel_positions(t.size(dim), share.size, share.index, key).to(t.device());
  return t.index_select(dim, pos);
}

}  // namespace smp::sdk
