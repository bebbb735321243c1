#include "graph/loss_normalizer.h"

#include <ATen/ATen.h>

namespace smp {

void LossNormalizer::add(LossSums& sums, const at::Tensor& loss, const at::Tensor& count) const {
  const double value = loss.detach().sum().item<double>();
  if (reduction_ == ModelGraph::LossReduction::Mean) {
    sums.loss += value * static_cast<double>(samples_);
    sums.items += static_cast<double>(samples_);
  } else {
    sums.loss += value;
    sums.items += count.detach().sum().item<double>();
  }
}

}  // namespace smp
