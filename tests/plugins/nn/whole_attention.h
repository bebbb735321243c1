// The reference of the context-parallel attention tests: softmax(q k^T scale
// + mask) v over the whole sequence, q, k, v [b, h, s, d], causal or not;
// pad_mask (optional, [b, s], 0 = a padding key): those scores -1e9, as
// attention_core's.
#pragma once

#include <ATen/ATen.h>

#include <limits>

namespace smp_test {

inline at::Tensor whole_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                  double scale, const at::Tensor& pad_mask = {}) {
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul(scale);
  if (pad_mask.defined()) scores = scores.masked_fill(pad_mask.eq(0).view({q.size(0), 1, 1, -1}), -1e9);
  if (causal) {
    const int64_t s = q.size(2);
    scores = scores.masked_fill(at::ones({s, s}, at::kBool).triu(1), -std::numeric_limits<double>::infinity());
  }
  return at::matmul(at::softmax(scores, -1), v);
}

}  // namespace smp_test
