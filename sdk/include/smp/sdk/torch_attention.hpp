// Megatron-Core's attention block, vocabulary-parallel embedding and
// sequence-parallel regions as ordinary torch::nn::Modules, for a program
// that writes its model with smp's modules (torch_parallel.hpp's linear
// layers) rather than a plan over torch::nn::Linear (tp_plan.hpp).
//
//   struct Block : torch::nn::Module {     // a decoder block under sequence parallelism
//     std::shared_ptr<torch::nn::LayerNormImpl> norm{register_module("norm",
//         std::make_shared<smp::sdk::SequenceParallelLayerNormImpl>(std::vector<int64_t>{d}))};
//     smp::sdk::ParallelSelfAttention attn{register_module("attn", smp::sdk::ParallelSelfAttention(
//         smp::sdk::ParallelSelfAttentionOptions(d, heads).sequence_parallel(true)))};
//     at::Tensor forward(at::Tensor x) { return x + attn->forward(norm->forward(x)); }
//   };
//
// As with ColumnParallelLinear, the program builds them whole (the unsplit
// module's initialisation); when smp creates the node holding one at tp > 1
// it binds it to the rank's tensor-parallel group: the layers keep their
// shards and report their placements. At tp = 1, or outside smp, each
// computes the unsplit math.
//
// ParallelSelfAttention: multi-head self-attention on [b, s, h]; q, k and v
// are ColumnParallelLinear (split by heads: this rank's heads / tp of them),
// the output projection RowParallelLinear; the input enters the
// tensor-parallel region once for the three (f, or under sequence_parallel
// the sequence all-gathered), the projection's partial products are summed
// over tp (or reduce-scattered along the sequence). A head count that does
// not divide by tp is refused naming the module.
//
// VocabParallelEmbedding: the table split by vocabulary rows; each rank looks
// up the rows it holds (zeros for the others) and the result is summed over
// tp, or under sequence_parallel reduce-scattered along the sequence (the
// way into a sequence-parallel region).
//
// Sequence-parallel regions: ScatterToSequence (this rank's share of the
// sequence; backward all-gathers) enters one from activations every tp rank
// holds whole; GatherFromSequence (all-gather; backward this rank's share, or
// reduce-scatter when what follows is tensor-parallel) leaves it, e.g. before
// a head every rank computes whole. SequenceParallelLayerNorm is
// torch::nn::LayerNorm (the same parameters and math) whose parameters'
// gradients, partial sums over tp when each rank normalises its own tokens,
// smp sums over tp (placed partial_grad("tp")); any other per-token module
// gets the same from a plan's TpStyle::SequenceParallel.
#pragma once

#include <smp/sdk/collectives.hpp>
#include <smp/sdk/module.hpp>
#include <smp/sdk/torch_parallel.hpp>

#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace smp::sdk {

struct ParallelSelfAttentionOptions {
  ParallelSelfAttentionOptions(int64_t dim, int64_t heads) : dim_(dim), heads_(heads) {}
  TORCH_ARG(int64_t, dim);
  TORCH_ARG(int64_t, heads);
  // Each position attends to itself and those before it.
  TORCH_ARG(bool, causal) = true;
  // Biases on q, k, v and the output projection.
  TORCH_ARG(bool, bias) = true;
  // The input and output split along the sequence (dimension 1 of [b, s, h]) over tp.
  TORCH_ARG(bool, sequence_parallel) = false;
};

class ParallelSelfAttentionImpl : public torch::nn::Module, public detail::TensorParallelLinear {
 public:
  explicit ParallelSelfAttentionImpl(const ParallelSelfAttentionOptions& options_)
      : options(options_),
        q(register_module("q", ColumnParallelLinear(options_.dim(), options_.dim(), options_.bias()))),
        k(register_module("k", ColumnParallelLinear(options_.dim(), options_.dim(), options_.bias()))),
        v(register_module("v", ColumnParallelLinear(options_.dim(), options_.dim(), options_.bias()))),
        proj(register_module("proj", RowParallelLinear(options_.dim(), options_.dim(), options_.bias(),
                                                       /*input_is_parallel=*/true, options_.sequence_parallel(), 1))) {
    if (options.heads() <= 0 || options.dim() % options.heads() != 0)
      throw Error("ParallelSelfAttention: dim " + std::to_string(options.dim()) + " does not divide into " +
                  std::to_string(options.heads()) + " heads");
  }
  ParallelSelfAttentionImpl(int64_t dim, int64_t heads)
      : ParallelSelfAttentionImpl(ParallelSelfAttentionOptions(dim, heads)) {}

  // x: [b, s, dim] (under sequence_parallel at tp > 1: this rank's s / tp tokens).
  at::Tensor forward(const at::Tensor& x) {
    if (x.dim() != 3 || x.size(2) != options.dim())
      throw Error((what_.empty() ? std::string("ParallelSelfAttention") : what_) + ": input " + c10::str(x.sizes()) +
                  " is not [batch, tokens, " + std::to_string(options.dim()) + "]");
    at::Tensor in = x;  // the whole sequence, on every tp rank
    if (tp_size_ > 1) in = options.sequence_parallel() ? gather_from_sequence(x, comm_, 1) : copy_to_region(x, comm_);
    const int64_t b = in.size(0), s = in.size(1), head_dim = options.dim() / options.heads();
    const int64_t local = options.heads() / tp_size_;  // this rank's heads
    auto heads_of = [&](ColumnParallelLinear& l) {  // [b, local, s, head_dim]
      return torch::nn::functional::linear(in, l->weight, l->bias).view({b, s, local, head_dim}).transpose(1, 2);
    };
    const at::Tensor qh = heads_of(q), kh = heads_of(k), vh = heads_of(v);
    at::Tensor scores = at::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    if (options.causal()) {
      const at::Tensor pos = at::arange(s, x.options().dtype(at::kLong));
      scores = scores.masked_fill(pos.unsqueeze(0) > pos.unsqueeze(1), -std::numeric_limits<double>::infinity());
    }
    const at::Tensor heads = at::matmul(at::softmax(scores, -1), vh);  // [b, local, s, head_dim]
    return proj->forward(heads.transpose(1, 2).reshape({b, s, local * head_dim}));
  }

  void bind(const ModuleContext& ctx) override {
    const std::string what = "ParallelSelfAttention of node '" + ctx.node_name + "'";
    if (ctx.tp_size > 1 && options.heads() % ctx.tp_size != 0)
      throw Error(what + ": heads = " + std::to_string(options.heads()) + " does not divide by tp = " +
                  std::to_string(ctx.tp_size) + ": each tp rank computes heads / tp of them");
    bind_group(ctx, what);
  }
  // No parameters of its own: q, k, v and proj report theirs.
  std::vector<std::pair<std::string, Param>> placements() const override { return {}; }

  ParallelSelfAttentionOptions options;
  ColumnParallelLinear q, k, v;
  RowParallelLinear proj;
};
TORCH_MODULE(ParallelSelfAttention);

class VocabParallelEmbeddingImpl : public torch::nn::Module, public detail::TensorParallelLinear {
 public:
  // sequence_parallel: the output [.., s, .., h] reduce-scattered along seq_dim (1 for [b, s] ids).
  VocabParallelEmbeddingImpl(int64_t vocab, int64_t dim, bool sequence_parallel = false, int64_t seq_dim = 1)
      : sequence_parallel_(sequence_parallel), seq_dim_(seq_dim) {
    torch::nn::Embedding whole(vocab, dim);  // torch::nn::Embedding's initialisation
    weight = register_parameter("weight", whole->weight.detach().clone());
  }
  at::Tensor forward(const at::Tensor& ids) {
    if (tp_size_ == 1) return at::embedding(weight, ids);
    // Megatron's: the rows this rank holds, zeros for the others, summed over tp.
    const at::Tensor local = ids - vocab_start_;
    const at::Tensor outside = (local < 0).logical_or(local >= weight.size(0));
    const at::Tensor rows =
        at::embedding(weight, local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0);
    if (!sequence_parallel_) return reduce_from_region(rows, comm_);
    detail::check_sequence_split(rows, seq_dim_, tp_size_, what_);
    return reduce_scatter_to_sequence(rows, comm_, seq_dim_);
  }
  void bind(const ModuleContext& ctx) override {
    const bool fresh = !bound_;
    bind_group(ctx, "VocabParallelEmbedding of node '" + ctx.node_name + "'");
    if (!fresh || !bound_) return;
    detail::keep_shard(weight, 0, tp_rank_, tp_size_, "node '" + ctx.node_name + "': VocabParallelEmbedding's table");
    vocab_start_ = tp_rank_ * weight.size(0);
  }
  std::vector<std::pair<std::string, Param>> placements() const override {
    Param w;
    w.shard_dim = 0;
    return {{"weight", w}};
  }
  at::Tensor weight;

 private:
  bool sequence_parallel_;
  int64_t seq_dim_;
  int64_t vocab_start_ = 0;
};
TORCH_MODULE(VocabParallelEmbedding);

namespace detail {

// A parameterless module bound to the tp group (a one-rank context leaves an earlier binding as it is).
class SequenceRegion : public PlacedModule {
 public:
  void bind(const ModuleContext& ctx) override {
    if (ctx.tp_size == 1) return;
    tp_size_ = ctx.tp_size;
    comm_ = ctx.tp;
    what_ = ctx.node_name;
  }
  std::vector<std::pair<std::string, Param>> placements() const override { return {}; }

 protected:
  int tp_size_ = 1;
  Comm comm_;
  std::string what_;
};

}  // namespace detail

// Into a sequence-parallel region from activations every tp rank holds whole:
// this rank's share of the sequence (dimension seq_dim); backward all-gathers.
class ScatterToSequenceImpl : public torch::nn::Module, public detail::SequenceRegion {
 public:
  explicit ScatterToSequenceImpl(int64_t seq_dim = 1) : seq_dim_(seq_dim) {}
  at::Tensor forward(const at::Tensor& x) {
    if (tp_size_ == 1) return x;
    detail::check_sequence_split(x, seq_dim_, tp_size_, "ScatterToSequence of node '" + what_ + "'");
    return scatter_to_region(x, comm_, seq_dim_);
  }

 private:
  int64_t seq_dim_;
};
TORCH_MODULE(ScatterToSequence);

// Out of a sequence-parallel region: the whole sequence (all-gathered along
// seq_dim). Backward: this rank's share of the gradient, for what follows
// computed whole on every tp rank (a head, the loss); with
// tensor_parallel_output_grad, reduce-scattered instead, for what follows
// computing partial results on each rank (a tensor-parallel layer).
class GatherFromSequenceImpl : public torch::nn::Module, public detail::SequenceRegion {
 public:
  explicit GatherFromSequenceImpl(int64_t seq_dim = 1, bool tensor_parallel_output_grad = false)
      : seq_dim_(seq_dim), tensor_parallel_output_grad_(tensor_parallel_output_grad) {}
  at::Tensor forward(const at::Tensor& x) {
    if (tp_size_ == 1) return x;
    if (seq_dim_ >= x.dim())
      throw Error("GatherFromSequence of node '" + what_ + "': dimension " + std::to_string(seq_dim_) + " of " +
                  c10::str(x.sizes()) + ", which has no such dimension");
    return tensor_parallel_output_grad_ ? gather_from_sequence(x, comm_, seq_dim_)
                                        : gather_from_region(x, comm_, seq_dim_);
  }

 private:
  int64_t seq_dim_;
  bool tensor_parallel_output_grad_;
};
TORCH_MODULE(GatherFromSequence);

// torch::nn::LayerNorm for a sequence-parallel region: the same parameters
// (weight, bias) and math; each tp rank normalises its own tokens, so its
// parameters' gradients are partial sums over tp, which smp sums over tp. A
// program holding a LayerNorm as std::shared_ptr<torch::nn::LayerNormImpl>
// can put either in its place.
class SequenceParallelLayerNormImpl : public torch::nn::LayerNormImpl, public PlacedModule {
 public:
  explicit SequenceParallelLayerNormImpl(std::vector<int64_t> normalized_shape)
      : torch::nn::LayerNormImpl(std::move(normalized_shape)) {}
  explicit SequenceParallelLayerNormImpl(const torch::nn::LayerNormOptions& options)
      : torch::nn::LayerNormImpl(options) {}
  at::Tensor forward(const at::Tensor& x) { return torch::nn::LayerNormImpl::forward(x); }
  void bind(const ModuleContext&) override {}
  std::vector<std::pair<std::string, Param>> placements() const override {
    Param partial;
    partial.tp_grad_sum = true;
    std::vector<std::pair<std::string, Param>> out;
    if (weight.defined()) out.emplace_back("weight", partial);
    if (bias.defined()) out.emplace_back("bias", partial);
    return out;
  }
};
TORCH_MODULE(SequenceParallelLayerNorm);

}  // namespace smp::sdk
