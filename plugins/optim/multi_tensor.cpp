#include "multi_tensor.h"

#include <smp/sdk/optimizer.hpp>

namespace smp_optim {

using smp::sdk::Error;

Kernels kernels_of(const std::string& v) {
  if (v == "auto") return Kernels::Auto;
  if (v == "per_tensor") return Kernels::PerTensor;
  if (v == "foreach") return Kernels::Foreach;
  if (v == "fused") return Kernels::Fused;
  throw Error("optimizer.kernels: expected \"auto\", \"per_tensor\", \"foreach\" or \"fused\", got \"" + v + "\"");
}

const char* to_string(Kernels k) {
  switch (k) {
    case Kernels::Auto: return "auto";
    case Kernels::PerTensor: return "per_tensor";
    case Kernels::Foreach: return "foreach";
    case Kernels::Fused: return "fused";
  }
  return "?";
}

Kernels kernels_for(Kernels asked, const at::Device& device, bool has_fused) {
  if (asked != Kernels::Auto) return asked;
  if (!device.is_cuda()) return Kernels::PerTensor;
  return has_fused ? Kernels::Fused : Kernels::Foreach;
}

void check_fused_available(Kernels asked, const std::vector<at::Tensor>& params, bool has_fused_cuda,
                           const char* optimizer, const char* cuda_since) {
  if (asked != Kernels::Fused) return;
  for (const auto& p : params) {
    const bool cuda = p.is_cuda();
    if (cuda ? has_fused_cuda : (SMP_OPTIM_HAS_FUSED_CPU && has_fused_cuda)) continue;
    throw Error(std::string("optimizer.kernels = \"fused\": LibTorch ") + TORCH_VERSION + " has no fused " + optimizer +
                " kernel for " + (cuda ? "CUDA" : "the CPU") + " (LibTorch " + (cuda ? cuda_since : "2.4") +
                " and later have one): use \"auto\" or \"foreach\"");
  }
}

std::vector<Group> multi_tensor_groups(const std::vector<std::pair<size_t, Kernels>>& members,
                                       const std::vector<at::Tensor>& params, const std::vector<bool>& decay) {
  // (kernels, device, dtype, decay) -> the open group's position in `out` and its bytes so far
  using Key = std::tuple<int, std::string, int, bool>;
  std::map<Key, std::pair<size_t, int64_t>> open;
  std::vector<Group> out;
  for (const auto& [i, k] : members) {
    const at::Tensor& p = params[i];
    const bool d = decay.at(i);
    const Key key{static_cast<int>(k), p.device().str(), static_cast<int>(p.scalar_type()), d};
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    auto it = open.find(key);
    if (it == open.end() || (it->second.second > 0 && it->second.second + bytes > kChunkBytes)) {
      out.push_back({k, d, {}});
      it = open.insert_or_assign(key, std::make_pair(out.size() - 1, int64_t{0})).first;
    }
    out[it->second.first].index.push_back(i);
    it->second.second += bytes;
  }
  return out;
}

std::vector<at::Tensor> pick(const std::vector<at::Tensor>& all, const std::vector<size_t>& index) {
  std::vector<at::Tensor> out;
  out.reserve(index.size());
  for (size_t i : index) out.push_back(all[i]);
  return out;
}

std::vector<at::Tensor> scaled_gradients(const std::vector<at::Tensor>& grads, const std::vector<size_t>& index,
                                         at::ScalarType dtype, double scale) {
  std::vector<at::Tensor> out;
  out.reserve(index.size());
  bool converted = false;
  for (size_t i : index) {
    const at::Tensor& g = grads[i];
    converted = converted || g.scalar_type() != dtype;
    out.push_back(g.scalar_type() == dtype ? g : g.to(dtype));  // a 16-bit gradient of an fp32 master
  }
  if (scale == 1.0) return out;
  if (!converted) return at::_foreach_mul(out, scale);
  // Some are copies already: scale those in place, the others into new tensors.
  std::vector<at::Tensor> same, copies;
  std::vector<size_t> same_at;
  for (size_t j = 0; j < out.size(); ++j) {
    if (grads[index[j]].scalar_type() == dtype) same.push_back(out[j]), same_at.push_back(j);
    else copies.push_back(out[j]);
  }
  if (!copies.empty()) at::_foreach_mul_(copies, scale);
  if (!same.empty()) {
    std::vector<at::Tensor> scaled = at::_foreach_mul(same, scale);
    for (size_t s = 0; s < same_at.size(); ++s) out[same_at[s]] = scaled[s];
  }
  return out;
}

}  // namespace smp_optim
