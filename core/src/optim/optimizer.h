// AdamW with decoupled weight decay on matrices (not on biases and norms), and
// the learning-rate schedule (linear warm-up, cosine decay to min_lr).
//
// step() takes a gradient scale that is applied on the fly (like fused
// optimizers that unscale mixed-precision gradients): the dp average and the
// clipping coefficient cost no extra pass over the gradients. fp32 contiguous
// CPU parameters with fp32 gradients go through one fused loop (one read of p, g, m, v and one
// write of p, m, v per element instead of ~9 ATen passes); anything else
// through the same formula in ATen ops.
#pragma once

#include <ATen/core/Tensor.h>

#include <utility>
#include <vector>

namespace smp {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

class AdamW {
 public:
  // params: what is updated (the parameters, their fp32 masters under mixed
  // precision, or under ZeRO this rank's 1-D shard segments of them); the state
  // has their dtype and device. decay[i]: whether params[i] is weight-decayed;
  // empty = matrices only (dim >= 2).
  AdamW(std::vector<at::Tensor> params, AdamWOptions options, std::vector<bool> decay = {});
  // The update of params[i] uses grad_scale * grads[i] (any floating dtype;
  // undefined = skip it); the gradients are not changed.
  void step(double lr, double grad_scale, const std::vector<at::Tensor>& grads);
  int64_t state_bytes() const;

  // What it keeps between steps, for the train state: per updated tensor its
  // named state tensors (each the shape of the tensor), and the steps taken
  // (bias correction).
  std::vector<std::pair<const char*, const std::vector<at::Tensor>*>> per_tensor_state() const {
    return {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
  }
  int64_t steps() const { return t_; }
  void set_steps(int64_t steps) { t_ = steps; }

 private:
  std::vector<at::Tensor> params_, exp_avg_, exp_avg_sq_;
  std::vector<bool> decay_;
  AdamWOptions opt_;
  int64_t t_ = 0;
};

struct LrSchedule {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup = 0, total = 1;
  double at(int64_t step) const;  // step counts from 0
};

}  // namespace smp
