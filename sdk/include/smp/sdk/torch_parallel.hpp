// Tensor-parallel layers as ordinary torch::nn::Modules, for a program's own
// modules (Megatron's column- and row-parallel linear layers).
//
// The program builds them whole, like torch::nn::Linear (the same
// initialisation, so a model built with them starts where the serial one
// does); when smp creates the node that holds one (TorchModel, or a kind of
// torch_module_factory), it binds the layer to the rank's tensor-parallel
// group: the layer keeps its shard of the weights and tells the core where
// they live (a shard on tp, for gradient sync, the norm, ZeRO and
// checkpoints). At tp = 1, or outside smp, they are plain linear layers.
//
//   struct Mlp : torch::nn::Module {                 // the program's own module
//     smp::sdk::ColumnParallelLinear up{register_module("up", smp::sdk::ColumnParallelLinear(d, 4 * d))};
//     smp::sdk::RowParallelLinear down{register_module("down", smp::sdk::RowParallelLinear(4 * d, d))};
//     at::Tensor forward(at::Tensor x) { return down->forward(torch::gelu(up->forward(x))); }
//   };
//
// Column: y = x Wᵀ + b with W split by rows (outputs); the output stays split
// along its last dimension (for a row-parallel layer next) unless
// gather_output. Row: W split by columns (inputs), its input split along the
// last dimension; the partial products are summed over tp, then b is added.
//
// Sequence parallelism (Megatron's sequence_parallel; the trailing constructor
// arguments): the activations outside the tensor-parallel region are split
// along the sequence dimension seq_dim (1: [b, s, h]; 0: [s, b, h]). Column
// all-gathers its input along it first (backward: reduce-scatter); Row
// reduce-scatters its partial products along it instead of all-reducing them
// (backward: all-gather), then adds its bias to this rank's tokens (its
// gradient a partial sum over tp, placed partial_grad("tp")). The attention
// block, the vocabulary-parallel embedding and the sequence-parallel regions
// are in torch_attention.hpp.
#pragma once

#include <smp/sdk/collectives.hpp>
#include <smp/sdk/module.hpp>

#include <torch/nn/functional/linear.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace smp::sdk {

// A module whose parameters smp places on the mesh: bound once to the node's
// context, then it reports each of its own parameters' placements.
class PlacedModule {
 public:
  virtual ~PlacedModule() = default;
  virtual void bind(const ModuleContext& ctx) = 0;
  // Its own (direct) parameters by local name, and their placements.
  virtual std::vector<std::pair<std::string, Param>> placements() const = 0;
};

namespace detail {

// Keeps rows [rank * n / size, ...) of dim `dim` of a parameter, in place (set_data).
inline void keep_shard(at::Tensor& p, int64_t dim, int rank, int size, const std::string& what) {
  const int64_t n = p.size(dim);
  if (n % size != 0)
    throw Error(what + ": dimension " + std::to_string(dim) + " (" + std::to_string(n) + ") does not divide by tp = " +
                std::to_string(size));
  p.set_data(p.detach().narrow(dim, rank * (n / size), n / size).clone());
}

// The sequence length of an activation about to be split along seq_dim over
// tp: refused naming `what` unless it divides.
inline void check_sequence_split(const at::Tensor& x, int64_t seq_dim, int tp, const std::string& what) {
  if (seq_dim >= x.dim())
    throw Error(what + ": sequence parallelism along dimension " + std::to_string(seq_dim) + " of " +
                c10::str(x.sizes()) + ", which has no such dimension");
  if (x.size(seq_dim) % tp != 0)
    throw Error(what + ": sequence length " + std::to_string(x.size(seq_dim)) + " (dimension " +
                std::to_string(seq_dim) + " of " + c10::str(x.sizes()) + ") does not divide by tp = " +
                std::to_string(tp) + ": sequence parallelism splits each sequence into tp equal parts");
}

class TensorParallelLinear : public PlacedModule {
 protected:
  // One rank (the cost profile, a serial run) leaves the layer whole and unbound.
  void bind_group(const ModuleContext& ctx, const std::string& what) {
    if (!bound_) what_ = what;
    if (!bound_ && ctx.tp_size == 1) return;
    if (bound_ && ctx.tp_size == tp_size_) return;  // the same module created again (a shared node)
    if (bound_) throw Error(what + " is already split for tp = " + std::to_string(tp_size_));
    bound_ = true;
    tp_size_ = ctx.tp_size;
    tp_rank_ = ctx.tp_rank;
    comm_ = ctx.tp;
  }
  bool bound_ = false;
  int tp_size_ = 1, tp_rank_ = 0;
  Comm comm_;
  std::string what_;  // "ColumnParallelLinear of node 'net.1'", for refusals
};

}  // namespace detail

class ColumnParallelLinearImpl : public torch::nn::Module, public detail::TensorParallelLinear {
 public:
  ColumnParallelLinearImpl(int64_t in, int64_t out, bool bias = true, bool gather_output = false,
                           bool sequence_parallel = false, int64_t seq_dim = 1)
      : gather_output_(gather_output), sequence_parallel_(sequence_parallel), seq_dim_(seq_dim) {
    torch::nn::Linear whole(torch::nn::LinearOptions(in, out).bias(bias));  // torch::nn::Linear's initialisation
    weight = register_parameter("weight", whole->weight.detach().clone());
    if (bias) this->bias = register_parameter("bias", whole->bias.detach().clone());
  }
  at::Tensor forward(const at::Tensor& x) {
    if (tp_size_ == 1) return torch::nn::functional::linear(x, weight, bias);
    at::Tensor y = torch::nn::functional::linear(enter(x), weight, bias);
    return gather_output_ ? gather_from_region(y, comm_, y.dim() - 1) : y;
  }
  void bind(const ModuleContext& ctx) override {
    const bool fresh = !bound_;
    bind_group(ctx, "ColumnParallelLinear of node '" + ctx.node_name + "'");
    if (!fresh || !bound_) return;
    detail::keep_shard(weight, 0, tp_rank_, tp_size_, "node '" + ctx.node_name + "': ColumnParallelLinear weight");
    if (bias.defined()) detail::keep_shard(bias, 0, tp_rank_, tp_size_, "node '" + ctx.node_name + "': its bias");
  }
  std::vector<std::pair<std::string, Param>> placements() const override {
    std::vector<std::pair<std::string, Param>> out;
    Param w;
    w.shard_dim = 0;
    out.emplace_back("weight", w);
    if (bias.defined()) out.emplace_back("bias", w);
    return out;
  }
  // Into the tensor-parallel region: f (the gradient summed over tp), or under
  // sequence parallelism the sequence all-gathered (the gradient reduce-scattered).
  at::Tensor enter(const at::Tensor& x) const {
    if (tp_size_ == 1) return x;
    if (!sequence_parallel_) return copy_to_region(x, comm_);
    if (seq_dim_ >= x.dim() - 1)
      throw Error(what_ + ": sequence_parallel along dimension " + std::to_string(seq_dim_) + " of its input " +
                  c10::str(x.sizes()) + ", which has no such dimension before its features");
    return gather_from_sequence(x, comm_, seq_dim_);
  }
  at::Tensor weight, bias;

 private:
  bool gather_output_, sequence_parallel_;
  int64_t seq_dim_;
};
TORCH_MODULE(ColumnParallelLinear);

class RowParallelLinearImpl : public torch::nn::Module, public detail::TensorParallelLinear {
 public:
  RowParallelLinearImpl(int64_t in, int64_t out, bool bias = true, bool input_is_parallel = true,
                        bool sequence_parallel = false, int64_t seq_dim = 1)
      : input_is_parallel_(input_is_parallel), sequence_parallel_(sequence_parallel), seq_dim_(seq_dim) {
    torch::nn::Linear whole(torch::nn::LinearOptions(in, out).bias(bias));
    weight = register_parameter("weight", whole->weight.detach().clone());
    if (bias) this->bias = register_parameter("bias", whole->bias.detach().clone());
  }
  at::Tensor forward(const at::Tensor& x) {
    if (tp_size_ == 1) return torch::nn::functional::linear(x, weight, bias);
    const at::Tensor in = input_is_parallel_ ? x : scatter_to_region(x, comm_, x.dim() - 1);
    const at::Tensor partial = torch::nn::functional::linear(in, weight);
    at::Tensor y;
    if (sequence_parallel_) {
      detail::check_sequence_split(partial, seq_dim_, tp_size_, what_);
      y = reduce_scatter_to_sequence(partial, comm_, seq_dim_);
    } else {
      y = reduce_from_region(partial, comm_);
    }
    return bias.defined() ? y + bias : y;
  }
  void bind(const ModuleContext& ctx) override {
    const bool fresh = !bound_;
    bind_group(ctx, "RowParallelLinear of node '" + ctx.node_name + "'");
    if (!fresh || !bound_) return;
    detail::keep_shard(weight, 1, tp_rank_, tp_size_, "node '" + ctx.node_name + "': RowParallelLinear weight");
  }
  std::vector<std::pair<std::string, Param>> placements() const override {
    Param w;
    w.shard_dim = 1;
    // The bias whole, its gradient the same on each tp rank.
    if (!sequence_parallel_ || !bias.defined()) return {{"weight", w}};
    Param partial;  // added to this rank's tokens only: its gradient a partial sum over tp, as Megatron's
    partial.tp_grad_sum = true;
    return {{"weight", w}, {"bias", partial}};
  }
  at::Tensor weight, bias;

 private:
  bool input_is_parallel_, sequence_parallel_;
  int64_t seq_dim_;
};
TORCH_MODULE(RowParallelLinear);

// Binds every PlacedModule inside `root` to `ctx`; their parameters'
// placements by full name (as root->named_parameters() names them).
inline std::map<std::string, Param> bind_placed(torch::nn::Module& root, const ModuleContext& ctx) {
  std::map<std::string, Param> placed;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    auto* p = dynamic_cast<PlacedModule*>(item.value().get());
    if (!p) continue;
    try {
      p->bind(ctx);
    } catch (const Error& e) {  // which module of the node refused
      if (item.key().empty()) throw;
      throw Error(std::string(e.what()) + " (module '" + item.key() + "' of the node)");
    }
    for (auto& [local, param] : p->placements())
      placed[item.key().empty() ? local : item.key() + "." + local] = param;
  }
  return placed;
}

// Whether `root` holds a PlacedModule that splits a parameter (its node is
// split over tp); one that only binds to a group (SyncBatchNorm) does not count.
inline bool holds_placed(torch::nn::Module& root) {
  for (const auto& m : root.modules(/*include_self=*/true))
    if (auto* p = dynamic_cast<PlacedModule*>(m.get()); p && !p->placements().empty()) return true;
  return false;
}

}  // namespace smp::sdk
