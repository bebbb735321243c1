// The standard optimizers, over the tensors the core hands over (parameters,
// fp32 masters or ZeRO shard segments): every update is elementwise per tensor.
// Weight decay is decoupled (AdamW, SGDW: p <- p (1 - lr wd)) and applies to
// the tensors the core marks (train.weight_decay_on). [optimizer] key l2: the
// coupled form (torch.optim.SGD's and Adam's weight_decay), l2 p added to
// every parameter's gradient before the update.
#pragma once

#include <smp/sdk/optimizer.hpp>

#include "multi_tensor.h"

#include <vector>

namespace smp_optim {

// AdamW (Loshchilov & Hutter), bias-corrected; [optimizer] keys beta1, beta2,
// eps (the job's train.beta1/beta2/eps), kernels (multi_tensor.h). Per tensor:
// fp32 contiguous CPU tensors with fp32 gradients take one fused pass, anything
// else the same formula in ATen ops; on CUDA (kernels = "auto") LibTorch's
// _fused_adamw_, or the formula in _foreach_ kernels.
class AdamW : public smp::sdk::Optimizer {
 public:
  explicit AdamW(const smp::sdk::OptimizerSetup& setup);
  void step(const smp::sdk::OptimizerUpdate& u) override;
  std::vector<smp::sdk::OptimizerState> state() override;

 private:
  std::vector<at::Tensor> params_, exp_avg_, exp_avg_sq_;
  std::vector<bool> decay_;
  double beta1_, beta2_, eps_, weight_decay_, l2_ = 0;
  Kernels kernels_ = Kernels::Auto;
};

// SGD with momentum (PyTorch's: buf <- momentum buf + (1 - dampening) g, the
// first step buf <- g), optionally Nesterov (g + momentum buf); [optimizer]
// keys momentum (0), dampening (0), nesterov (false), kernels (multi_tensor.h:
// on CUDA _fused_sgd_ with momentum, else _foreach_ kernels).
class Sgd : public smp::sdk::Optimizer {
 public:
  explicit Sgd(const smp::sdk::OptimizerSetup& setup);
  void step(const smp::sdk::OptimizerUpdate& u) override;
  std::vector<smp::sdk::OptimizerState> state() override;

 private:
  std::vector<at::Tensor> params_, momentum_buffer_;
  std::vector<bool> decay_;
  double momentum_, dampening_, weight_decay_, l2_ = 0;
  bool nesterov_;
  Kernels kernels_ = Kernels::Auto;
};

}  // namespace smp_optim
