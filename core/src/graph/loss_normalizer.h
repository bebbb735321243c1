// How the losses of a step's microbatches on every data-parallel rank become
// one mean, in one place. The graph says how its loss is normalised:
//   Mean: the loss is a mean over the microbatch's samples; it weighs as many
//         items as the microbatch has samples.
//   Sum:  the loss is a sum over items (unmasked tokens, say) and a count value
//         (a node's output, carried to the last stage) says how many.
// Each microbatch's backward starts from loss x seed (Mean: its sample count;
// Sum: 1), so .grad accumulates the gradient of the summed loss; after the
// step's sums are reduced over the ranks, the optimizer scales the gradient
// by 1 / (items in the step), and the step's loss is sum / items.
#pragma once

#include <smp/model_graph.h>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace smp {

struct LossSums {
  double loss = 0;   // sum over microbatches of loss x seed
  double items = 0;  // the items those losses cover
  LossSums& operator+=(const LossSums& o) {
    loss += o.loss, items += o.items;
    return *this;
  }
};

class LossNormalizer {
 public:
  LossNormalizer(ModelGraph::LossReduction reduction, int64_t samples_per_microbatch)
      : reduction_(reduction), samples_(samples_per_microbatch) {}

  // The weight of a microbatch's loss value in the step's sum.
  double seed() const { return reduction_ == ModelGraph::LossReduction::Mean ? static_cast<double>(samples_) : 1.0; }
  // The gradient fed to it: the weight times the step's fp16 loss scale (1 otherwise).
  double backward_seed(double loss_scale) const { return seed() * loss_scale; }

  // Adds one microbatch: its loss value and (Sum) its count value.
  void add(LossSums& sums, const at::Tensor& loss, const at::Tensor& count) const;

  // After the sums are reduced over the job: the step's mean loss and the
  // factor that turns the accumulated gradient into the mean's gradient.
  static double mean(const LossSums& global) { return global.items > 0 ? global.loss / global.items : 0.0; }
  static double grad_scale(const LossSums& global) { return global.items > 0 ? 1.0 / global.items : 0.0; }

 private:
  ModelGraph::LossReduction reduction_;
  int64_t samples_;
};

}  // namespace smp
