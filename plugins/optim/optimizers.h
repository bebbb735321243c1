// The standard optimizers, over the tensors the core hands over (parameters,
// fp32 masters or ZeRO shard segments): every update is elementwise per tensor.
// Weight decay is decoupled (AdamW, SGDW: p <- p (1 - lr wd)) and applies to
// the tensors the core marks (matrices).
#pragma once

#include <smp/sdk/optimizer.hpp>

#include <vector>

namespace smp_optim {

// AdamW (Loshchilov & Hutter), bias-corrected; [optimizer] keys beta1, beta2,
// eps (the job's train.beta1/beta2/eps). fp32 contiguous CPU tensors with fp32
// gradients take one fused pass; anything else the same formula in ATen ops.
class AdamW : public smp::sdk::Optimizer {
 public:
  explicit AdamW(const smp::sdk::OptimizerSetup& setup);
  void step(const smp::sdk::OptimizerUpdate& u) override;
  std::vector<smp::sdk::OptimizerState> state() override;

 private:
  std::vector<at::Tensor> params_, exp_avg_, exp_avg_sq_;
  std::vector<bool> decay_;
  double beta1_, beta2_, eps_, weight_decay_;
};

// SGD with momentum (PyTorch's: buf <- momentum buf + (1 - dampening) g, the
// first step buf <- g), optionally Nesterov (g + momentum buf); [optimizer]
// keys momentum (0), dampening (0), nesterov (false).
class Sgd : public smp::sdk::Optimizer {
 public:
  explicit Sgd(const smp::sdk::OptimizerSetup& setup);
  void step(const smp::sdk::OptimizerUpdate& u) override;
  std::vector<smp::sdk::OptimizerState> state() override;

 private:
  std::vector<at::Tensor> params_, momentum_buffer_;
  std::vector<bool> decay_;
  double momentum_, dampening_, weight_decay_;
  bool nesterov_;
};

}  // namespace smp_optim
