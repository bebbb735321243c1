// Mixed precision (train.precision = bf16 | fp16), the Megatron / DeepSpeed way:
// parameters and activations in the 16-bit compute dtype, an fp32 master copy of
// every parameter that the optimizer updates (its state is fp32 too), gradients
// accumulated and reduced in train.grad_reduce_dtype (GradientSync), and for
// fp16 a dynamic loss scale: the backward starts from loss x scale, a step
// whose gradients overflowed (inf / nan) is skipped and the scale halved, and
// after loss_scale_window good steps in a row the scale doubles.
#pragma once

#include <smp/job_config.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace smp {

at::ScalarType compute_dtype(Precision p);  // kFloat, kBFloat16, kHalf

// fp32 masters of 16-bit parameters.
class MasterWeights {
 public:
  // Keeps an fp32 copy of each parameter, then casts the parameter itself to
  // `compute` in place (set_data: the module's handles see the cast tensor).
  MasterWeights(std::vector<at::Tensor> params, at::ScalarType compute);
  std::vector<at::Tensor>& masters() { return masters_; }  // what the optimizer updates
  void copy_to_params();  // after each optimizer step
  int64_t bytes() const;

 private:
  std::vector<at::Tensor> params_, masters_;
};

struct LossScaleOptions {
  double initial = 65536.0, min = 1.0, growth = 2.0, backoff = 0.5;
  int64_t window = 1000;  // good steps in a row before the scale grows
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScaleOptions o) : o_(o), scale_(o.initial) {}
  double scale() const { return scale_; }
  // After a step's gradients are known on every rank (finite: their global
  // norm is). Returns whether the optimizer may apply them; on overflow the
  // scale backs off (not below min), and a warning says when it reached min.
  bool update(bool finite);
  int64_t skipped() const { return skipped_; }
  // Its state between steps: the scale, good steps in a row, steps skipped.
  int64_t good_steps() const { return good_; }
  void restore(double scale, int64_t good_steps, int64_t skipped) {
    scale_ = scale;
    good_ = good_steps;
    skipped_ = skipped;
  }

 private:
  LossScaleOptions o_;
  double scale_;
  int64_t good_ = 0, skipped_ = 0;
};

}  // namespace smp
