// Tensor parallelism by a plan on a program's unmodified layers, as DTensor's
// parallelize_module: module names or patterns mapped to styles, applied to
// the program's own torch::nn::Linear and torch::nn::Embedding.
//
//   smp::sdk::parallelize(*net, {{"*.attn.q", smp::sdk::TpStyle::Colwise}, {"*.attn.o", smp::sdk::TpStyle::Rowwise},
//                                {"0", smp::sdk::TpStyle::VocabEmbedding}});
//
// When smp creates the node holding a planned layer (TorchModel, tp > 1), the
// layer keeps this rank's shard of its weights (Megatron's split: colwise by
// output features, rowwise by input features, the embedding by vocabulary
// rows) and tells the core where they live, so gradient sync, the norm, ZeRO
// and checkpoints treat it like smp's own tp layers. The layer's own code is
// not changed: while smp runs the node, LibTorch's dispatcher hands the ops a
// planned weight takes part in (linear, its weight's transpose and the
// addmm/matmul that use it, embedding) to smp, which adds Megatron's f and g:
// a colwise layer's input enters the tensor-parallel region (its gradient is
// summed over tp), a rowwise layer's partial outputs are summed over tp before
// its bias, a vocabulary-parallel embedding looks up the rows it holds and
// sums over tp. A colwise layer's output holds this rank's share of the
// features: a module that reshapes it must take the head count from the size
// (view({B, T, -1, head_dim})); a reshape with the whole count is refused
// naming the node and saying so.
//
// Sequence parallelism (Megatron-LM's; DTensor's SequenceParallel with
// ColwiseParallel(input_layouts=Shard(1)) and RowwiseParallel(output_layouts=
// Shard(1))): the activations between tensor-parallel regions stay split along
// the sequence (token) dimension, seq_dim of the style (default 1: torch's [b,
// s, h]; Megatron's [s, b, h] is 0). The region is entered by
// VocabEmbeddingToSequence (the embedding's sum over tp reduce-scattered along
// the sequence) or RowwiseToSequence, runs per-token modules on this rank's
// T / tp tokens (SequenceParallel: LayerNorm, an activation, any module with
// parameters that acts on each token alone; their parameters' gradients are
// partial sums over tp, summed over tp by the core), all-gathers the sequence
// before a ColwiseFromSequence layer (backward: reduce-scatter), reduce-scatters
// a RowwiseToSequence layer's partial outputs along the sequence instead of
// all-reducing them (backward: all-gather), and leaves through
// ColwiseGatheredFromSequence (a head: the sequence gathered, then the
// features). A sequence length that does not divide by tp is refused naming
// the layer. Dropout under SequenceParallel draws its mask for this rank's
// tokens only: the masks differ from the serial run's (smp_tp's dist_dropout
// slices the whole mask; a plan cannot see a parameterless module's call).
//
// The interception uses c10's TESTING_ONLY_GenericMode dispatch key (mode_key.hpp, shared with converted BatchNorm), a mode
// key above autograd present in LibTorch 1.13 to 2.x and unused by LibTorch
// itself: the only C++ way to act on calls inside an unmodified module (the
// C++ frontend has no forward hooks). It is on only while a planned node runs.
#pragma once

#include <smp/sdk/collectives.hpp>
#include <smp/sdk/mode_key.hpp>
#include <smp/sdk/module.hpp>
#include <smp/sdk/torch_parallel.hpp>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace smp::sdk {

// Colwise: the output stays split along its last dimension (for a rowwise
// layer next). ColwiseGathered: the output gathered whole on every tp rank (a
// head whose logits a loss reads); its bias stays whole. Rowwise: the input
// split along its last dimension, the output summed over tp. VocabEmbedding:
// the table split by vocabulary rows.
// Sequence parallelism (the input or output split along the sequence, seq_dim):
// ColwiseFromSequence / ColwiseGatheredFromSequence: as Colwise /
// ColwiseGathered, the sequence-split input all-gathered first.
// RowwiseToSequence / VocabEmbeddingToSequence: as Rowwise / VocabEmbedding,
// the sum over tp reduce-scattered along the sequence. SequenceParallel: any
// module acting per token (LayerNorm), run on this rank's tokens as it is;
// its parameters stay whole, their gradients summed over tp.
enum class TpStyle {
  Colwise,
  ColwiseGathered,
  Rowwise,
  VocabEmbedding,
  SequenceParallel,
  ColwiseFromSequence,
  ColwiseGatheredFromSequence,
  RowwiseToSequence,
  VocabEmbeddingToSequence,
};

// A plan's entry: the style, and for the sequence-parallel styles the
// activations' sequence dimension (1: [b, s, h]; 0: [s, b, h]).
struct PlanStyle {
  PlanStyle(TpStyle style, int64_t seq_dim = 1) : style(style), seq_dim(seq_dim) {}  // NOLINT: implicit on purpose
  TpStyle style;
  int64_t seq_dim;
};

namespace tp_plan_detail {

using mode_key_detail::kModeKey;
using mode_key_detail::Normal;

inline bool colwise(TpStyle s) { return s == TpStyle::Colwise || s == TpStyle::ColwiseFromSequence; }
inline bool gathered_head(TpStyle s) { return s == TpStyle::ColwiseGathered || s == TpStyle::ColwiseGatheredFromSequence; }
inline bool rowwise(TpStyle s) { return s == TpStyle::Rowwise || s == TpStyle::RowwiseToSequence; }
inline bool embedding(TpStyle s) { return s == TpStyle::VocabEmbedding || s == TpStyle::VocabEmbeddingToSequence; }
inline bool from_sequence(TpStyle s) { return s == TpStyle::ColwiseFromSequence || s == TpStyle::ColwiseGatheredFromSequence; }
inline bool to_sequence(TpStyle s) { return s == TpStyle::RowwiseToSequence || s == TpStyle::VocabEmbeddingToSequence; }
inline const char* style_name(TpStyle s) {
  switch (s) {
    case TpStyle::Colwise: return "Colwise";
    case TpStyle::ColwiseGathered: return "ColwiseGathered";
    case TpStyle::Rowwise: return "Rowwise";
    case TpStyle::VocabEmbedding: return "VocabEmbedding";
    case TpStyle::SequenceParallel: return "SequenceParallel";
    case TpStyle::ColwiseFromSequence: return "ColwiseFromSequence";
    case TpStyle::ColwiseGatheredFromSequence: return "ColwiseGatheredFromSequence";
    case TpStyle::RowwiseToSequence: return "RowwiseToSequence";
    case TpStyle::VocabEmbeddingToSequence: return "VocabEmbeddingToSequence";
  }
  return "?";
}

// A planned weight once its node is bound: how ops on it run.
struct Planned {
  TpStyle style;
  Comm comm;
  int64_t vocab_start = 0, vocab_rows = 0;  // VocabEmbedding: the rows this rank holds
  int tp_size = 1;
  int64_t seq_dim = 1;  // the sequence-parallel styles: the activations' sequence dimension
  std::string what;     // "node 'net.1': planned layer 'up'", for refusals
};

// How a parameter smp keeps as a shard is split (to split it again after
// take_whole made it whole for the program).
struct Shard {
  int64_t dim = 0;
  int rank = 0, size = 1;
  std::vector<int64_t> sizes;  // the shard's
  std::string what;
};

// A parameter take_whole() made whole: how to split it again, and the
// weight's ops while it was split.
struct Released {
  Shard shard;
  bool weight = false;
  Planned planned;
  at::Tensor grad;  // the shard's .grad (a view of the runtime's gradient bucket), put back with the shard
};

struct Registry {
  std::mutex mutex;
  // Marked by parallelize(), held weakly: a module freed and another made at
  // its address is not taken for the planned one.
  std::map<const torch::nn::Module*, std::pair<std::weak_ptr<torch::nn::Module>, PlanStyle>> modules;
  mode_key_detail::ByTensor<Planned> weights;    // bound: weight tensors, how ops on them run
  mode_key_detail::ByTensor<Shard> shards;       // every parameter kept as a shard (weights, colwise biases)
  mode_key_detail::ByTensor<Released> released;  // made whole again by take_whole()

  const PlanStyle* module(const torch::nn::Module* m) {
    auto it = modules.find(m);
    if (it == modules.end()) return nullptr;
    if (it->second.first.expired()) {
      modules.erase(it);
      return nullptr;
    }
    return &it->second.second;
  }
  void sweep() {
    for (auto it = modules.begin(); it != modules.end();) it = it->second.first.expired() ? modules.erase(it) : std::next(it);
    weights.sweep();
    shards.sweep();
    released.sweep();
  }
};
// One registry per process, shared by every shared object that includes this
// header: a function of default visibility in a versioned namespace, so its
// static is one (GNU unique) object across the plugins a process loads, even
// when they are built with hidden visibility (a later layout of Registry
// gets another namespace and its own object). A program's executable shares
// it with them only when it exports its symbols (-rdynamic, CMake's
// ENABLE_EXPORTS); otherwise the program's plans and a plugin's live in two
// registries, and the first of them to run a planned node owns the kernels.
inline namespace registry_v2 {
__attribute__((visibility("default"))) inline Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace registry_v2

// The transposes of planned weights taken while the node runs, kept alive
// (so no other tensor reuses their address) until the node's call ends.
struct Transposed {
  at::Tensor tensor;
  Planned planned;
};
inline std::vector<Transposed>& transposed() {
  thread_local std::vector<Transposed> t;
  return t;
}

// A copy, taken under the lock: the entry may go (take_whole) while the op runs.
inline std::optional<Planned> weight_of(const at::Tensor& t) {
  if (!t.defined()) return std::nullopt;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Planned* p = r.weights.find(t);
  return p ? std::optional<Planned>(*p) : std::nullopt;
}
inline const Planned* transposed_of(const at::Tensor& t) {
  for (const auto& e : transposed())
    if (e.tensor.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return &e.planned;
  return nullptr;
}

// The ops below run with the mode key excluded (Normal): what they call dispatches as usual.

inline at::Tensor gathered(const at::Tensor& y, const Planned& p) { return gather_from_region(y, p.comm, y.dim() - 1); }

// The sequence dimension of an activation whose last dimension is its features.
inline void check_sequence(const at::Tensor& x, const Planned& p, const char* which) {
  if (p.seq_dim >= x.dim() - 1)
    throw Error(p.what + " (" + style_name(p.style) + ", seq_dim " + std::to_string(p.seq_dim) + "): its " + which +
                " " + c10::str(x.sizes()) + " has no sequence dimension " + std::to_string(p.seq_dim) +
                " before its features");
}
// Into a colwise layer: f (the gradient summed over tp), or under sequence
// parallelism the sequence all-gathered (the gradient reduce-scattered).
inline at::Tensor enter(const at::Tensor& x, const Planned& p) {
  if (!from_sequence(p.style)) return copy_to_region(x, p.comm);
  check_sequence(x, p, "input");
  return gather_from_sequence(x, p.comm, p.seq_dim);
}
// Out of a rowwise layer or the embedding: g (the partial outputs summed over
// tp), or under sequence parallelism reduce-scattered along the sequence.
inline at::Tensor leave(const at::Tensor& partial, const Planned& p) {
  if (!to_sequence(p.style)) return reduce_from_region(partial, p.comm);
  check_sequence(partial, p, "output");
  const int64_t n = partial.size(p.seq_dim);
  if (n % p.tp_size != 0)
    throw Error(p.what + " (" + style_name(p.style) + "): sequence length " + std::to_string(n) + " (dimension " +
                std::to_string(p.seq_dim) + " of " + c10::str(partial.sizes()) + ") does not divide by tp = " +
                std::to_string(p.tp_size) + ": sequence parallelism splits each sequence into tp equal parts");
  return reduce_scatter_to_sequence(partial, p.comm, p.seq_dim);
}

inline at::Tensor t_op(const at::Tensor& self) {
  Normal n;
  at::Tensor out = at::t(self);
  if (const std::optional<Planned> p = weight_of(self)) {
    if (embedding(p->style))
      throw Error("a vocabulary-parallel embedding's table used as a linear layer's weight (a tied head) is not "
                  "supported by a plan yet: plan the head as its own layer, or leave the embedding unplanned");
    transposed().push_back({out, *p});
  }
  return out;
}

// alpha mat1 mat2 (+ beta self), with no pass for a factor of 1 (F::linear's case).
inline at::Tensor scaled(const at::Tensor& t, const c10::Scalar& factor) {
  return factor.isIntegral(false) && factor.toLong() == 1 ? t : t * factor;
}

inline at::Tensor addmm_op(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                           const c10::Scalar& beta, const c10::Scalar& alpha) {
  Normal n;
  const Planned* p = transposed_of(mat2);
  if (!p) return at::addmm(self, mat1, mat2, beta, alpha);
  if (colwise(p->style)) return at::addmm(self, enter(mat1, *p), mat2, beta, alpha);
  at::Tensor y = gathered_head(p->style) ? gathered(at::mm(enter(mat1, *p), mat2), *p) : leave(at::mm(mat1, mat2), *p);
  y = scaled(y, alpha);
  return self.defined() ? y + scaled(self, beta) : y;  // the bias once, after the sum or the gather
}

inline at::Tensor matmul_op(const at::Tensor& self, const at::Tensor& other) {
  Normal n;
  const Planned* p = transposed_of(other);
  if (!p) return at::matmul(self, other);
  if (colwise(p->style)) return at::matmul(enter(self, *p), other);
  if (gathered_head(p->style)) return gathered(at::matmul(enter(self, *p), other), *p);
  return leave(at::matmul(self, other), *p);
}

inline at::Tensor linear_op(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  Normal n;
  const std::optional<Planned> p = weight_of(weight);
  if (!p) return at::linear(input, weight, bias);
  if (colwise(p->style)) return at::linear(enter(input, *p), weight, bias);
  if (gathered_head(p->style)) {
    at::Tensor y = gathered(at::linear(enter(input, *p), weight), *p);
    return bias && bias->defined() ? y + *bias : y;
  }
  at::Tensor sum = leave(at::linear(input, weight), *p);
  return bias && bias->defined() ? sum + *bias : sum;
}

inline at::Tensor embedding_op(const at::Tensor& weight, const at::Tensor& indices, int64_t padding_idx,
                               bool scale_grad_by_freq, bool sparse) {
  Normal n;
  const std::optional<Planned> p = weight_of(weight);
  if (!p) return at::embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse);
  // Megatron's VocabParallelEmbedding: the rows this rank holds, zeros for the others, summed over tp.
  at::Tensor local = indices - p->vocab_start;
  at::Tensor outside = (local < 0).logical_or(local >= p->vocab_rows);
  at::Tensor rows = at::embedding(weight, local.masked_fill(outside, 0), -1, scale_grad_by_freq, sparse);
  return leave(rows.masked_fill(outside.unsqueeze(-1), 0), *p);
}

// The plan's kernels, registered once per process (mode_key.hpp): every
// other op falls through to LibTorch's kernels.
inline void register_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    mode_key_detail::ensure_fallthrough();
    if (mode_key_detail::has_kernel("linear")) return;  // another shared object's, over the same registry
    static torch::Library aten(torch::Library::IMPL, "aten", kModeKey, __FILE__, __LINE__);
    aten.impl("t", TORCH_FN(t_op));
    aten.impl("addmm", TORCH_FN(addmm_op));
    aten.impl("matmul", TORCH_FN(matmul_op));
    aten.impl("linear", TORCH_FN(linear_op));
    aten.impl("embedding", TORCH_FN(embedding_op));
  });
}

// Whether a pattern ("blocks.*.attn.q": '*' is one name component) matches a module path.
inline bool matches(const std::string& pattern, const std::string& path) {
  auto split = [](const std::string& s) {
    std::vector<std::string> out(1);
    for (char c : s) {
      if (c == '.')
        out.emplace_back();
      else
        out.back().push_back(c);
    }
    return out;
  };
  const auto p = split(pattern), n = split(path);
  if (p.size() != n.size()) return false;
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != "*" && p[i] != n[i]) return false;
  return true;
}

}  // namespace tp_plan_detail

// Marks the layers of `root` the plan names (patterns over
// root.named_modules() paths) with their styles; smp splits them when it
// creates their nodes at tp > 1. The colwise and rowwise styles take a
// torch::nn::Linear, the embedding styles a torch::nn::Embedding,
// SequenceParallel any module. Throws naming a pattern that matches nothing,
// a layer of another type or a negative seq_dim.
inline void parallelize(torch::nn::Module& root, const std::vector<std::pair<std::string, PlanStyle>>& plan) {
  using namespace tp_plan_detail;
  const auto modules = root.named_modules("", /*include_self=*/false);
  for (const auto& [pattern, planned] : plan) {
    const TpStyle style = planned.style;
    if (planned.seq_dim < 0)
      throw Error("parallelize: pattern '" + pattern + "': seq_dim " + std::to_string(planned.seq_dim) +
                  " (the sequence dimension counts from 0: 1 for [b, s, h], 0 for [s, b, h])");
    int found = 0;
    for (const auto& item : modules) {
      if (!matches(pattern, item.key())) continue;
      const bool linear = dynamic_cast<torch::nn::LinearImpl*>(item.value().get()) != nullptr;
      const bool is_embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(item.value().get()) != nullptr;
      if (style != TpStyle::SequenceParallel && ((embedding(style) && !is_embedding) || (!embedding(style) && !linear)))
        throw Error("parallelize: '" + item.key() + "' (pattern '" + pattern + "') is not a torch::nn::" +
                    (embedding(style) ? "Embedding" : "Linear") + ", which its style " + style_name(style) + " needs");
      if (auto* e = dynamic_cast<torch::nn::EmbeddingImpl*>(item.value().get()); e && embedding(style)) {
        const auto& o = e->options;
        if (o.padding_idx() || o.max_norm() || o.scale_grad_by_freq() || o.sparse())
          throw Error("parallelize: '" + item.key() + "': a vocabulary-parallel embedding with padding_idx, max_norm, "
                      "scale_grad_by_freq or sparse is not supported yet");
      }
      Registry& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      r.sweep();
      r.modules.insert_or_assign(item.value().get(), std::make_pair(std::weak_ptr<torch::nn::Module>(item.value()), planned));
      ++found;
    }
    if (found == 0) throw Error("parallelize: pattern '" + pattern + "' matches no module of the model");
  }
}

// The planned layers inside `root` (a node's module), split for ctx's tp
// group: their parameters' placements by full name. Nothing at tp = 1.
inline std::map<std::string, Param> bind_plan(torch::nn::Module& root, const ModuleContext& ctx) {
  using namespace tp_plan_detail;
  std::map<std::string, Param> placed;
  Registry& r = registry();
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    TpStyle style;
    int64_t seq_dim = 1;
    {
      std::lock_guard<std::mutex> lock(r.mutex);
      const PlanStyle* marked = r.module(item.value().get());
      if (!marked) continue;
      style = marked->style;
      seq_dim = marked->seq_dim;
    }
    const std::string prefix = item.key().empty() ? "" : item.key() + ".";
    const std::string what = "node '" + ctx.node_name + "': planned layer '" + item.key() + "'";
    if (style == TpStyle::SequenceParallel) {
      // Whole on every tp rank, each rank computing on its own tokens: the
      // gradients are partial sums over tp (the core sums them, Placement::partial_grad).
      Param partial;
      partial.tp_grad_sum = true;
      for (const auto& p : item.value()->named_parameters(/*recurse=*/true)) placed[prefix + p.key()] = partial;
      continue;
    }
    auto own = item.value()->named_parameters(/*recurse=*/false);
    at::Tensor weight = own["weight"];  // shares the module's tensor: set_data below changes the module's
    at::Tensor* bias = own.find("bias");
    Param w;
    w.shard_dim = rowwise(style) ? 1 : 0;
    placed[prefix + "weight"] = w;
    if (bias && bias->defined() && colwise(style)) placed[prefix + "bias"] = w;
    if (bias && bias->defined() && style == TpStyle::RowwiseToSequence) {
      Param partial;  // added to this rank's tokens only: its gradient a partial sum over tp, as Megatron's
      partial.tp_grad_sum = true;
      placed[prefix + "bias"] = partial;
    }
    std::lock_guard<std::mutex> lock(r.mutex);
    // Split already by an earlier runtime over the same model, or the same
    // module created again (a shared node): its ops go to this context's
    // group, if the shard is this rank's. Made whole again (take_whole): split afresh.
    if (const Shard* held = r.shards.find(weight)) {
      if (held->size != ctx.tp_size || held->rank != ctx.tp_rank)
        throw Error(what + " holds tp rank " + std::to_string(held->rank) + "'s shard of tp = " +
                    std::to_string(held->size) + " from an earlier runtime, and this one is tp rank " +
                    std::to_string(ctx.tp_rank) + " of " + std::to_string(ctx.tp_size) +
                    ": call smp::gather_into_modules (smp::Model::gather) with the earlier runtime first, which "
                    "makes the layers whole again");
      if (Planned* p = r.weights.find(weight)) p->comm = ctx.tp;
      continue;
    }
    r.released.erase(weight);
    if (bias && bias->defined()) r.released.erase(*bias);
    if (ctx.tp_size == 1) continue;
    const int64_t rows = weight.size(0);
    auto split = [&](at::Tensor& t, int64_t dim, const std::string& which) {
      detail::keep_shard(t, dim, ctx.tp_rank, ctx.tp_size, what + " " + which);
      if (t.grad().defined() && t.grad().sizes() != t.sizes()) t.mutable_grad() = at::Tensor();  // an earlier runtime's
      r.shards.put(t, Shard{dim, ctx.tp_rank, ctx.tp_size, t.sizes().vec(), what + " " + which});
    };
    split(weight, w.shard_dim, "weight");
    if (bias && bias->defined() && colwise(style)) split(*bias, 0, "bias");
    Planned p{style, ctx.tp, 0, 0, ctx.tp_size, seq_dim, what};
    if (embedding(style)) p.vocab_rows = rows / ctx.tp_size, p.vocab_start = ctx.tp_rank * p.vocab_rows;
    r.weights.put(weight, p);
  }
  if (!placed.empty()) register_kernels();
  return placed;
}

// The program takes its model back whole (smp::gather_into_modules): a
// parameter smp keeps as a shard becomes `whole`, until plan_reshard()
// splits it again (the runtime's next use of its node, or the next gather).
// False for any other tensor.
inline bool take_whole(at::Tensor& param, const at::Tensor& whole) {
  using namespace tp_plan_detail;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const Shard* shard = r.shards.find(param);
  if (!shard) return false;
  Released released{*shard, false, Planned{TpStyle::Colwise}, param.grad()};
  if (const Planned* p = r.weights.find(param)) released.weight = true, released.planned = *p;
  param.mutable_grad() = at::Tensor();  // a shard's gradient: not the whole parameter's
  param.set_data(whole.detach().to(param.device(), param.scalar_type()).clone());
  r.shards.erase(param);
  r.weights.erase(param);
  r.released.put(param, std::move(released));
  return true;
}

// `root`'s planned parameters that take_whole() made whole are split again
// as they were, from their current values, so that the runtime holding them
// sees the shards it describes (a parameter the runtime has already put
// back to a shard's size, as ZeRO-3 does when it gathers, is taken as it is).
inline void plan_reshard(torch::nn::Module& root) {
  using namespace tp_plan_detail;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.released.empty()) return;
  for (at::Tensor p : root.parameters(/*recurse=*/true)) {
    const Released* rel = r.released.find(p);
    if (!rel) continue;
    const Released kept = *rel;
    if (p.sizes().vec() != kept.shard.sizes) {
      torch::NoGradGuard no_grad;
      detail::keep_shard(p, kept.shard.dim, kept.shard.rank, kept.shard.size, kept.shard.what);
    }
    if (!p.grad().defined() && kept.grad.defined() && kept.grad.sizes() == p.sizes()) p.mutable_grad() = kept.grad;
    r.released.erase(p);
    r.shards.put(p, kept.shard);
    if (kept.weight) r.weights.put(p, kept.planned);
  }
}

// Whether `root` holds a planned layer (its node is split over tp).
inline bool holds_planned(torch::nn::Module& root) {
  using namespace tp_plan_detail;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& m : root.modules(/*include_self=*/true))
    if (r.module(m.get())) return true;
  return false;
}

// While a node with planned layers (or converted BatchNorm, sync_batch_norm.hpp) runs: smp's kernels see its ops.
class PlanScope {
 public:
  explicit PlanScope(bool active) : active_(active), mode_(active) {}
  ~PlanScope() {
    if (active_) tp_plan_detail::transposed().clear();
  }
  PlanScope(const PlanScope&) = delete;
  PlanScope& operator=(const PlanScope&) = delete;

 private:
  bool active_;
  ModeScope mode_;
};

}  // namespace smp::sdk
