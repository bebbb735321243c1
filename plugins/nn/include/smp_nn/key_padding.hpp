// The padding masks of a sequence split over a context-parallel group: each
// rank holds its share's mask ([b, s / cp], nonzero = a real token, zero = a
// padding key no query attends to); one all-gather gives every rank all the
// shares', for the attention of its queries over the whole sequence (ring and
// all-to-all forms). A few bytes per token, once per attention call.
#pragma once

#include <smp/sdk/collectives.hpp>

#include <ATen/ATen.h>

#include <string>

namespace smp_nn {

// [cp, b, s / cp] bool, true = padding, rank r's share at r; undefined when
// pad_mask is (every rank of the group must pass one, or none).
inline at::Tensor gather_key_padding(const at::Tensor& pad_mask, const at::Tensor& q, const smp::sdk::Comm& comm,
                                     const std::string& what) {
  if (!pad_mask.defined()) return {};
  // q [b, heads, s / cp, d]
  if (pad_mask.dim() != 2 || pad_mask.size(0) != q.size(0) || pad_mask.size(1) != q.size(2))
    throw smp::sdk::Error(what + ": the padding mask must be this rank's share [b, s / cp] = [" +
                          std::to_string(q.size(0)) + ", " + std::to_string(q.size(2)) + "], got " +
                          c10::str(pad_mask.sizes()));
  // As int64 (what every transport carries); compared after the gather.
  return comm.allgather(pad_mask.to(at::kLong).unsqueeze(0)).eq(0);
}

}  // namespace smp_nn
