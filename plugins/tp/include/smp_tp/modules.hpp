// The distributed (tensor-parallel) module kinds of smp_tp.so, Megatron-style.
//
// Every kind initialises the FULL serial parameters with smp_nn's init (same seed, same
// order) and keeps its slice, so a shard is exactly the serial parameter's slice.
// Param.shard_dim names the split dim (-1 = replicated); Param.tp_grad_sum marks a
// replicated parameter whose gradient differs per rank under sequence parallelism.
//
// Layout of activations between layers:
//   sequence_parallel off: [b, s, h] replicated on every tp rank.
//   sequence_parallel on:  [b, s/t, h], rank r holds sequence positions [r*s/t, (r+1)*s/t).
// Graph inputs (ids, padding masks [b, s], targets) are always full and replicated.
//
// kind                          serial kind          method: inputs -> outputs (t = tp size)
// tp_linear                     linear               forward: as linear; config adds
//                                                      tp_mode = "column" (default) | "row" | "none",
//                                                      gather_output (column, default true),
//                                                      input_is_parallel (row, default false)
// column_parallel_linear        -                    forward: x [...,in] -> [...,out/t] or gathered [...,out]
// row_parallel_linear           -                    forward: x [...,in] or [...,in/t] -> [...,out]
// vocab_parallel_embedding      embedding            forward: ids [b,s] -> [b,s,dim] (SP: [b,s/t,dim])
//                                                    attend: x [b,s,dim] (SP: [b,s/t,dim]) -> [b,s,V/t]
// vocab_parallel_cross_entropy  cross_entropy        forward: logits [b,s,V/t], targets [b,s] -> scalar
//                                                      (or sum, count: reduction "sum")
// parallel_attention            attention            forward: x (, pad mask [b,s]) -> like x
// parallel_mlp                  mlp                  forward: x -> like x
// parallel_transformer_layer    transformer_layer    forward: x (, pad mask [b,s]) -> like x
// dist_position_embedding       position_embedding   forward: x -> x + P[offset : offset + s_local]
// dist_layer_norm               layer_norm           forward: as layer_norm (params tp_grad_sum under SP)
// dist_dropout                  dropout              forward: as dropout, the mask sliced like x under SP
// sharded_embedding_table       embedding_table      forward: ids -> vectors; config adds
//                                                      ids = "replicated" (default) | "distinct"
// dist_select                   select               forward: as select; under SP a select along the
//                                                      sequence all-gathers it first (output whole)
#pragma once

#include <smp_nn/modules.hpp>
#include <smp_tp/functions.hpp>

#include <smp/sdk/collectives.hpp>
#include <smp_test_faults/fault.hpp>

#include <cstdlib>
#include <memory>
#include <string>

namespace smp_tp {

using namespace smp_nn;  // configs, init, math
using smp::sdk::Comm;

// Fault points (builds made for testing only; plugins/test_faults): a
// row-parallel output keeps this rank's partial sum instead of the
// all-reduced one (tp_partial_sum); under sequence parallelism the gathered
// sequence comes in the wrong rank order (sp_gather).
inline bool fault_tp_partial_sum() {
  static const bool on = smp_test_faults::fault("tp_partial_sum");
  return on;
}
inline bool fault_sp_gather() {
  static const bool on = smp_test_faults::fault("sp_gather");
  return on;
}

// Where this module runs on the tp axis, and the region entry/exit collectives.
struct Tp {
  Comm comm;
  int rank = 0, size = 1;
  bool sp = false;
  std::string node;

  static Tp from(const ModuleContext& ctx) {
    Tp t;
    t.comm = ctx.tp;
    t.rank = t.comm.rank();
    t.size = t.comm.size();
    t.sp = ctx.sequence_parallel && t.size > 1;
    t.node = ctx.node_name;
    if (ctx.tp_size != t.size || ctx.tp_rank != t.rank)
      throw smp::sdk::Error("node '" + t.node + "': module context says tp rank " + std::to_string(ctx.tp_rank) +
                            " of " + std::to_string(ctx.tp_size) + ", the tp communicator says " +
                            std::to_string(t.rank) + " of " + std::to_string(t.size));
    return t;
  }
  void check_seq(const Tensor& x, bool gathered) const {
    if (x.dim() < 3)
      throw smp::sdk::Error("node '" + node + "': sequence parallelism needs [b, s, ...] activations, got " +
                            c10::str(x.sizes()));
    if (gathered && x.size(1) % size != 0)
      throw smp::sdk::Error("node '" + node + "': sequence length " + std::to_string(x.size(1)) +
                            " not divisible by tp " + std::to_string(size) + " (sequence parallelism)");
  }
  // Into a column-parallel region: f (identity fwd, all-reduce bwd), or under SP the
  // all-gather of the sequence (reduce-scatter bwd).
  Tensor enter(const Tensor& x) const {
    if (!sp) return smp::sdk::copy_to_region(x, comm);
    check_seq(x, false);
    const Tensor gathered = smp::sdk::gather_from_sequence(x, comm, 1);
    // sp_gather (tests only): every rank's part one place along, rank r's positions holding rank r+1's.
    return fault_sp_gather() ? gathered.roll(-x.size(1), 1) : gathered;
  }
  // Out of a row-parallel region: g (all-reduce fwd, identity bwd), or under SP the
  // reduce-scatter along the sequence (all-gather bwd).
  Tensor exit(const Tensor& y) const {
    if (fault_tp_partial_sum()) return y;
    if (!sp) return smp::sdk::reduce_from_region(y, comm);
    check_seq(y, true);
    return smp::sdk::reduce_scatter_to_sequence(y, comm, 1);
  }
  int64_t seq_offset(int64_t local_len) const { return sp ? rank * local_len : 0; }
  // A decoding call feeds a position or a few: sequence parallelism cannot split them.
  void refuse_sp_decode(const smp::sdk::Call& call) const {
    if (sp && call.decode)
      throw smp::sdk::Error("node '" + node + "': tp.sequence_parallel splits each sequence over tp, and a decoding "
                            "call feeds one new position: generate with tp.sequence_parallel = false (a checkpoint "
                            "loads into either)");
  }
  int64_t full_seq(int64_t local_len) const { return sp ? local_len * size : local_len; }
  void divisible(int64_t n, const char* what) const {
    if (n % size != 0)
      throw smp::sdk::Error("node '" + node + "': " + what + " " + std::to_string(n) + " not divisible by tp " +
                            std::to_string(size));
  }
};

// Dropout on an activation laid out per `tp` (mask drawn for the full tensor, sliced).
inline Tensor tp_dropout(const Tensor& y, double p, bool training, uint64_t seed, const Tp& tp) {
  if (!training || p <= 0.0) return y;
  if (!tp.sp) return dropout(y, p, training, seed);
  std::vector<int64_t> full = y.sizes().vec();
  full[1] = tp.full_seq(y.size(1));
  return dropout(y, p, training, seed, full, 1, tp.seq_offset(y.size(1)));
}

// k and v are split by heads when kv_heads divides tp; otherwise every rank
// holds them whole and uses only its query heads' share, so their gradients
// are partial sums over tp.
inline void add_attention_params(std::vector<Param>& out, const std::string& prefix, const AttentionParams& p,
                                 const AttentionConfig& c, const Tp& tp) {
  add_params(out, prefix + "q.", p.q, 0, 0);
  for (auto [name, kv] : {std::pair<const char*, const LinearParams*>{"k.", &p.k}, {"v.", &p.v}}) {
    if (kv_split(c, tp.size)) {
      add_params(out, prefix + name, *kv, 0, 0);
      continue;
    }
    out.push_back({prefix + name + "weight", kv->weight, -1, tp.size > 1});
    if (kv->bias.defined()) out.push_back({prefix + name + "bias", kv->bias, -1, tp.size > 1});
  }
  add_params(out, prefix + "out.", p.out, 1, -1, tp.sp);
}
inline void add_mlp_params(std::vector<Param>& out, const std::string& prefix, const MlpParams& p, bool sp) {
  add_params(out, prefix + "fc.", p.fc, 0, 0), add_params(out, prefix + "proj.", p.proj, 1, -1, sp);
}
inline void add_swiglu_params(std::vector<Param>& out, const std::string& prefix, const SwigluMlpParams& p, bool sp) {
  add_params(out, prefix + "gate.", p.gate, 0, 0), add_params(out, prefix + "up.", p.up, 0, 0);
  add_params(out, prefix + "down.", p.down, 1, -1, sp);
}
// A row-parallel output: the partial products summed over tp, then the bias.
inline Tensor row_exit(const Tp& tp, const Tensor& partial, const Tensor& bias) {
  Tensor y = tp.exit(partial);
  return bias.defined() ? y + bias : y;
}

// ---- the parallel blocks (x laid out per tp) ----
// decode: a decoding call's positions, whose K and V (this rank's kv heads) `cache` keeps.
// seq: the sequence axis' split, or null. Under it xf (after the SP gather)
// is this rank's whole share of the sequence.
inline Tensor parallel_attention_forward(const AttentionParams& p, const AttentionConfig& c, const Tp& tp,
                                         const Tensor& x, const Tensor& pad_mask, bool training, uint64_t seed,
                                         KvCache* cache = nullptr, const smp::sdk::Decode* decode = nullptr,
                                         const SequenceSplit* seq = nullptr) {
  const bool cp = seq && seq->split();
  if (cp) seq->check_call(decode != nullptr);
  Tensor xf = tp.enter(x);
  const int64_t nl = c.heads / tp.size;
  const bool split = kv_split(c, tp.size);
  const int64_t kvl = split ? c.kv_heads / tp.size : c.kv_heads, kv_offset = split ? tp.rank * kvl : 0;
  std::vector<Tensor> qkv = qkv_projection(xf, p.q, p.k, p.v, decode != nullptr);  // this rank's heads of each
  if (decode) check_decodable(c, pad_mask, tp.node);
  const Tensor positions = decode ? decode_positions(*decode, xf.size(1), xf.device())
                           : cp   ? seq->positions(xf.size(1), xf.device()).view({1, -1})
                                  : Tensor();
  if (c.rope_base > 0) {  // positions are whole here: under SP the input was gathered first
    qkv[0] = rotary(qkv[0], nl, c.head_dim(), c.rope_base, positions);
    qkv[1] = rotary(qkv[1], kvl, c.head_dim(), c.rope_base, positions);
  }
  if (decode) {
    const Tensor ctx = cache->attend(*decode, qkv[0], qkv[1], qkv[2], nl, kvl, kv_offset, tp.rank * nl, c.group(),
                                     c.head_dim(), tp.node);
    return row_exit(tp, at::linear(ctx, p.out.weight), p.out.bias);
  }
  if (cp) {
    // The ring carries this rank's kv heads when tp splits them (its query
    // heads use them group-major); otherwise one per query head.
    if (!split)
      for (int i : {1, 2}) qkv[i] = kv_for_heads(qkv[i], kvl, kv_offset, tp.rank * nl, nl, c.group(), c.head_dim());
    const Tensor ctx = seq->attend(qkv[0], qkv[1], qkv[2], nl, split ? kvl : nl, c.head_dim(), c.causal, pad_mask);
    return row_exit(tp, at::linear(ctx, p.out.weight), p.out.bias);
  }
  for (int i : {1, 2}) qkv[i] = kv_for_heads(qkv[i], kvl, kv_offset, tp.rank * nl, nl, c.group(), c.head_dim());
  Tensor ctx = attention_core(c.recompute_core, qkv[0], qkv[1], qkv[2], nl, c.head_dim(), c.causal, pad_mask,
                              c.dropout, training, mix_seed(seed, kAttnProbs), c.heads, tp.rank * nl);
  Tensor y = row_exit(tp, at::linear(ctx, p.out.weight), p.out.bias);
  return tp_dropout(y, c.dropout, training, mix_seed(seed, kAttnOut), tp);
}
inline Tensor parallel_mlp_forward(const MlpParams& p, const MlpConfig& c, const Tp& tp, const Tensor& x,
                                   bool training, uint64_t seed) {
  Tensor h = gelu_tanh(linear(tp.enter(x), p.fc));
  Tensor y = row_exit(tp, at::linear(h, p.proj.weight), p.proj.bias);
  return tp_dropout(y, c.dropout, training, mix_seed(seed, kMlpOut), tp);
}

// gate and up column-parallel (this rank's ffn columns), down row-parallel.
inline Tensor parallel_swiglu_mlp_forward(const SwigluMlpParams& p, const SwigluMlpConfig& c, const Tp& tp,
                                          const Tensor& x, bool training, uint64_t seed) {
  const Tensor xf = tp.enter(x);
  Tensor y = row_exit(tp, at::linear(swiglu(linear(xf, p.gate), linear(xf, p.up)), p.down.weight), p.down.bias);
  return tp_dropout(y, c.dropout, training, mix_seed(seed, kMlpOut), tp);
}

class ParallelAttention : public Module {
 public:
  ParallelAttention(const Json& cfg, const ModuleContext& ctx)
      : tp_(Tp::from(ctx)), c_(AttentionConfig::parse(cfg, ctx.node_name)), seq_(SequenceSplit::from(ctx)) {
    c_.recompute_core = ctx.recompute_attention_core();
    tp_.divisible(c_.heads, "heads");
    seq_.check_heads(c_.heads / tp_.size, kv_split(c_, tp_.size) ? c_.kv_heads / tp_.size : c_.heads / tp_.size);
    InitStream gen(ctx.init_seed);
    p_ = init_attention(gen, c_, tp_.rank, tp_.size);  // this rank's heads only
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 2, tp_.node, call.method);
    expect_dim(call.inputs[0], 3, c_.hidden, tp_.node, "input");
    Tensor mask = call.inputs.size() > 1 ? call.inputs[1] : Tensor();
    tp_.refuse_sp_decode(call);
    if (!call.decode) cache_.clear();
    return {parallel_attention_forward(p_, c_, tp_, call.inputs[0], mask, call.training, call.rng_seed, &cache_,
                                       call.decode, &seq_)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_attention_params(out, "", p_, c_, tp_);
    return out;
  }

 private:
  Tp tp_;
  AttentionConfig c_;
  SequenceSplit seq_;
  AttentionParams p_;
  KvCache cache_;
};

class ParallelMlp : public Module {
 public:
  ParallelMlp(const Json& cfg, const ModuleContext& ctx) : tp_(Tp::from(ctx)), c_(MlpConfig::parse(cfg, ctx.node_name)) {
    tp_.divisible(c_.ffn, "ffn");
    InitStream gen(ctx.init_seed);
    p_ = init_mlp(gen, c_, tp_.rank, tp_.size);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 1, tp_.node, call.method);
    expect_dim(call.inputs[0], call.inputs[0].dim(), c_.hidden, tp_.node, "input");
    return {parallel_mlp_forward(p_, c_, tp_, call.inputs[0], call.training, call.rng_seed)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_mlp_params(out, "", p_, tp_.sp);
    return out;
  }

 private:
  Tp tp_;
  MlpConfig c_;
  MlpParams p_;
};

class ParallelSwigluMlp : public Module {
 public:
  ParallelSwigluMlp(const Json& cfg, const ModuleContext& ctx)
      : tp_(Tp::from(ctx)), c_(SwigluMlpConfig::parse(cfg, ctx.node_name)) {
    tp_.divisible(c_.ffn, "ffn");
    InitStream gen(ctx.init_seed);
    p_ = init_swiglu_mlp(gen, c_, tp_.rank, tp_.size);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 1, tp_.node, call.method);
    expect_dim(call.inputs[0], call.inputs[0].dim(), c_.hidden, tp_.node, "input");
    return {parallel_swiglu_mlp_forward(p_, c_, tp_, call.inputs[0], call.training, call.rng_seed)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_swiglu_params(out, "", p_, tp_.sp);
    return out;
  }

 private:
  Tp tp_;
  SwigluMlpConfig c_;
  SwigluMlpParams p_;
};

// Pre-LN GPT-2 block; under SP the layer norms and residual adds run on the local
// sequence slice. Per forward: 2 region entries (f / all-gather) and 2 exits
// (all-reduce / reduce-scatter) of [b, s, h]; the same again in backward.
class ParallelTransformerLayer : public Module {
 public:
  ParallelTransformerLayer(const Json& cfg, const ModuleContext& ctx)
      : tp_(Tp::from(ctx)), c_(TransformerLayerConfig::parse(cfg, ctx.node_name)), seq_(SequenceSplit::from(ctx)) {
    c_.attn.recompute_core = ctx.recompute_attention_core();
    tp_.divisible(c_.attn.heads, "heads");
    seq_.check_heads(c_.attn.heads / tp_.size,
                     kv_split(c_.attn, tp_.size) ? c_.attn.kv_heads / tp_.size : c_.attn.heads / tp_.size);
    tp_.divisible(c_.mlp.ffn, "ffn");
    InitStream gen(ctx.init_seed);
    p_ = init_transformer_layer(gen, c_, tp_.rank, tp_.size);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 2, tp_.node, call.method);
    const Tensor& x = call.inputs[0];
    expect_dim(x, 3, c_.attn.hidden, tp_.node, "input");
    Tensor mask = call.inputs.size() > 1 ? call.inputs[1] : Tensor();
    tp_.refuse_sp_decode(call);
    if (!call.decode) cache_.clear();
    return {smp_nn::transformer_block(
        c_.post_norm, x,
        [&](const Tensor& t) {
          return parallel_attention_forward(p_.attn, c_.attn, tp_, t, mask, call.training, call.rng_seed, &cache_,
                                            call.decode, &seq_);
        },
        [&](const Tensor& t) {
          return c_.swiglu ? parallel_swiglu_mlp_forward(p_.swiglu, c_.swiglu_mlp(), tp_, t, call.training, call.rng_seed)
                           : parallel_mlp_forward(p_.mlp, c_.mlp, tp_, t, call.training, call.rng_seed);
        },
        [&](const Tensor& t) { return block_norm(t, p_.ln1, c_.eps); },
        [&](const Tensor& t) { return block_norm(t, p_.ln2, c_.eps); })};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_params(out, "ln1.", p_.ln1, tp_.sp);
    add_attention_params(out, "attn.", p_.attn, c_.attn, tp_);
    add_params(out, "ln2.", p_.ln2, tp_.sp);
    if (c_.swiglu) add_swiglu_params(out, "mlp.", p_.swiglu, tp_.sp);
    else add_mlp_params(out, "mlp.", p_.mlp, tp_.sp);
    return out;
  }

 private:
  Tp tp_;
  TransformerLayerConfig c_;
  SequenceSplit seq_;
  TransformerLayerParams p_;
  KvCache cache_;
};

// Y = X W^T + b with W's rows (outputs) split: rank r computes outputs [r*out/t, (r+1)*out/t).
// Input: replicated [..., in] (f on entry), or under SP [b, s/t, in] (all-gather on entry).
// gather_output: all-gather of the output features (then, under SP, this rank's sequence
// slice is kept, so the output is laid out like the input). Otherwise [..., out/t].
class ColumnParallelLinear : public Module {
 public:
  ColumnParallelLinear(const Json& cfg, const ModuleContext& ctx)
      : tp_(Tp::from(ctx)),
        c_(LinearConfig::parse(cfg, ctx.node_name)),
        gather_output_(config_get<bool>(cfg, "gather_output", ctx.node_name, true)) {
    tp_.divisible(c_.out, "out");
    InitStream gen(ctx.init_seed);
    p_ = init_linear(gen, c_.in, c_.out, c_.bias, c_.init_std, /*split rows=*/0, tp_.rank, tp_.size);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 1, tp_.node, call.method);
    const Tensor& x = call.inputs[0];
    expect_dim(x, x.dim(), c_.in, tp_.node, "input");
    Tensor y = linear(tp_.enter(x), p_);
    if (gather_output_) {
      y = smp::sdk::gather_from_region(y, tp_.comm, y.dim() - 1);
      if (tp_.sp) y = smp::sdk::scatter_to_region(y, tp_.comm, 1);
    }
    return {y};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_params(out, "", p_, 0, 0);
    return out;
  }

 private:
  Tp tp_;
  LinearConfig c_;
  bool gather_output_;
  LinearParams p_;
};

// Y = X W^T + b with W's columns (inputs) split; the partial products are summed by g
// (all-reduce) or, under SP, reduce-scattered along the sequence; b is added after.
// input_is_parallel: x is already [..., in/t] (e.g. a column-parallel output, full
// sequence under SP); otherwise x is laid out like an activation and split here
// (under SP: all-gathered along the sequence first).
class RowParallelLinear : public Module {
 public:
  RowParallelLinear(const Json& cfg, const ModuleContext& ctx)
      : tp_(Tp::from(ctx)),
        c_(LinearConfig::parse(cfg, ctx.node_name)),
        input_is_parallel_(config_get<bool>(cfg, "input_is_parallel", ctx.node_name, false)) {
    tp_.divisible(c_.in, "in");
    InitStream gen(ctx.init_seed);
    p_ = init_linear(gen, c_.in, c_.out, c_.bias, c_.init_std, /*split columns=*/1, tp_.rank, tp_.size);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 1, tp_.node, call.method);
    Tensor x = call.inputs[0];
    if (input_is_parallel_) {
      expect_dim(x, x.dim(), c_.in / tp_.size, tp_.node, "input (input_is_parallel)");
    } else {
      expect_dim(x, x.dim(), c_.in, tp_.node, "input");
      if (tp_.sp) {
        tp_.check_seq(x, false);
        x = smp::sdk::gather_from_region(x, tp_.comm, 1);
      }
      x = smp::sdk::scatter_to_region(x, tp_.comm, x.dim() - 1);
    }
    Tensor y = tp_.exit(at::linear(x, p_.weight));
    return {p_.bias.defined() ? y + p_.bias : y};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_params(out, "", p_, 1, -1, tp_.sp);
    return out;
  }

 private:
  Tp tp_;
  LinearConfig c_;
  bool input_is_parallel_;
  LinearParams p_;
};

// The rule's target for `linear`: config "tp_mode" picks column (default), row or none
// (replicated serial linear). With the defaults (gather_output=true, input_is_parallel=
// false) it is a drop-in replacement of `linear`; set gather_output=false on a column
// and input_is_parallel=true on the following row for the Megatron pair.
class TpLinear : public Module {
 public:
  TpLinear(const Json& cfg, const ModuleContext& ctx) {
    std::string mode = config_get<std::string>(cfg, "tp_mode", ctx.node_name, "column");
    if (mode == "column") impl_ = std::make_unique<ColumnParallelLinear>(cfg, ctx);
    else if (mode == "row") impl_ = std::make_unique<RowParallelLinear>(cfg, ctx);
    else if (mode == "none") impl_ = std::make_unique<Linear>(cfg, ctx);
    else
      throw smp::sdk::Error("node '" + ctx.node_name + "': config key 'tp_mode' must be \"column\", \"row\" or " +
                            "\"none\", got \"" + mode + "\"");
  }
  std::vector<Tensor> forward(const Call& call) override { return impl_->forward(call); }
  std::vector<Param> parameters() override { return impl_->parameters(); }

 private:
  std::unique_ptr<Module> impl_;
};

// Rows (vocab) split: rank r owns ids [r*V/t, (r+1)*V/t).
//   forward: masked local lookup, then all-reduce (SP: reduce-scatter along the sequence).
//   attend:  f (SP: all-gather along the sequence), then x W_r^T: vocab-sharded logits.
class VocabParallelEmbedding : public Module {
 public:
  VocabParallelEmbedding(const Json& cfg, const ModuleContext& ctx)
      : tp_(Tp::from(ctx)), c_(EmbeddingConfig::parse(cfg, ctx.node_name)) {
    tp_.divisible(c_.num, "vocab (num)");
    InitStream gen(ctx.init_seed);
    weight_ = param(normal(gen, {c_.num, c_.dim}, c_.init_std, Slice::part(0, c_.num, tp_.rank, tp_.size)));
    if (c_.attend_bias) bias_ = param(smp::sdk::init_constant({c_.num / tp_.size}, 0.0));
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_inputs(call.inputs, 1, 1, tp_.node, call.method);
    tp_.refuse_sp_decode(call);
    if (call.method == "attend") {
      expect_dim(call.inputs[0], 3, c_.dim, tp_.node, "attend input");
      Tensor x = tp_.enter(call.inputs[0]);
      return {bias_.defined() ? at::linear(x, weight_, bias_) : at::linear(x, weight_)};
    }
    expect_method(call.method, tp_.node);
    const Tensor& ids = call.inputs[0];
    expect_ids(ids, c_.num, tp_.node);
    const int64_t vl = c_.num / tp_.size;
    Tensor local = ids - tp_.rank * vl;
    Tensor outside = local.lt(0).logical_or(local.ge(vl));
    Tensor y = at::embedding(weight_, local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0);
    return {tp_.exit(y)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out{{"weight", weight_, 0, false}};
    if (bias_.defined()) out.push_back({"attend_bias", bias_, 0, false});
    return out;
  }

 private:
  Tp tp_;
  EmbeddingConfig c_;
  Tensor weight_, bias_;
};

class VocabParallelCrossEntropy : public Module {
 public:
  VocabParallelCrossEntropy(const Json& cfg, const ModuleContext& ctx)
      : tp_(Tp::from(ctx)), c_(CrossEntropyConfig::parse(cfg, ctx.node_name)) {}
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 2, 3, tp_.node, call.method);
    const Tensor weights = c_.check_inputs(call.inputs, tp_.node, "[..., V/t]");
    const Tensor &logits = call.inputs[0], &targets = call.inputs[1];
    const int64_t v = logits.size(-1);
    // Whole logits (a replicated head, e.g. BERT's next-sentence classifier, or
    // a gathered column-parallel one) when the config's vocab says so.
    if (tp_.size == 1 || (c_.vocab && v == c_.vocab))
      return c_.outputs(cross_entropy_sums(c_.mask_padding(logits), targets, c_.ignore_index, weights));
    if (c_.vocab && v * tp_.size != c_.vocab)
      throw smp::sdk::Error("node '" + tp_.node + "': logits last dim " + std::to_string(v) +
                            " is neither vocab " + std::to_string(c_.vocab) + " nor vocab / tp");
    Tensor w = targets.ne(c_.ignore_index).to(at::kFloat);
    if (weights.defined()) w = w.mul(weights.to(at::kFloat));
    LossSums sums{VocabParallelCrossEntropyFn::apply(c_.mask_padding(logits, tp_.rank * v), targets, w,
                                                     smp::sdk::comm_id(tp_.comm)),
                  w.sum()};
    return c_.outputs(sums);
  }

 private:
  Tp tp_;
  CrossEntropyConfig c_;
};

// Replicated P; under SP rank r adds rows [r*s/t, (r+1)*s/t) and P's gradient differs per
// rank (tp_grad_sum).
class DistPositionEmbedding : public Module {
 public:
  DistPositionEmbedding(const Json& cfg, const ModuleContext& ctx)
      : tp_(Tp::from(ctx)), c_(PositionEmbeddingConfig::parse(cfg, ctx.node_name)), seq_(SequenceSplit::from(ctx)) {
    InitStream gen(ctx.init_seed);
    weight_ = param(normal(gen, {c_.max_len, c_.dim}, c_.init_std));
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 1, tp_.node, call.method);
    const Tensor& x = call.inputs[0];
    expect_dim(x, 3, c_.dim, tp_.node, "input");
    tp_.refuse_sp_decode(call);
    if (call.decode) return {x + position_rows(weight_, *call.decode, x, tp_.node)};
    const int64_t s = x.size(1), off = tp_.seq_offset(s);
    if (tp_.full_seq(s) * seq_.size > c_.max_len)
      throw smp::sdk::Error("node '" + tp_.node + "': sequence length " + std::to_string(tp_.full_seq(s) * seq_.size) +
                            " exceeds max_len " + std::to_string(c_.max_len));
    // Under cp this rank's share of the sequence sits at its global positions; SP cuts that share again.
    if (seq_.split())
      return {x + weight_.index_select(0, seq_.positions(tp_.full_seq(s), x.device()).narrow(0, off, s))};
    return {x + weight_.narrow(0, off, s)};
  }
  std::vector<Param> parameters() override { return {{"weight", weight_, -1, tp_.sp}}; }

 private:
  Tp tp_;
  PositionEmbeddingConfig c_;
  SequenceSplit seq_;
  Tensor weight_;
};

// A norm under tp (dist_layer_norm, dist_rms_norm): whole on every tp rank;
// under sequence parallelism each rank normalises its own tokens, so the
// parameters' gradients are summed over tp.
template <class Params, Params (*Init)(int64_t), Tensor (*Apply)(const Tensor&, const Params&, double)>
class DistNorm : public Module {
 public:
  DistNorm(const Json& cfg, const ModuleContext& ctx) : tp_(Tp::from(ctx)), c_(NormConfig::parse(cfg, ctx.node_name)) {
    p_ = Init(c_.dim);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 1, tp_.node, call.method);
    expect_dim(call.inputs[0], call.inputs[0].dim(), c_.dim, tp_.node, "input");
    return {Apply(call.inputs[0], p_, c_.eps)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_params(out, "", p_, tp_.sp);
    return out;
  }

 private:
  Tp tp_;
  NormConfig c_;
  Params p_;
};
using DistLayerNorm = DistNorm<LayerNormParams, init_layer_norm, layer_norm>;
using DistRmsNorm = DistNorm<RmsNormParams, init_rms_norm, rms_norm>;

class DistDropout : public Module {
 public:
  DistDropout(const Json& cfg, const ModuleContext& ctx) : tp_(Tp::from(ctx)), p_(probability(cfg, "p", ctx.node_name)) {}
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 1, tp_.node, call.method);
    if (tp_.sp && call.training && p_ > 0) tp_.check_seq(call.inputs[0], false);
    return {tp_dropout(call.inputs[0], p_, call.training, mix_seed(call.rng_seed, kPlain), tp_)};
  }

 private:
  Tp tp_;
  double p_;
};

// Row-sharded lookup table (see ShardedLookupFn). Config: embedding_table's keys plus
// ids = "replicated" (default: every rank of the group passes the same ids, as in a tp
// group) | "distinct" (each rank its own ids; gradients summed at the owner).
class ShardedEmbeddingTable : public Module {
 public:
  ShardedEmbeddingTable(const Json& cfg, const ModuleContext& ctx)
      : tp_(Tp::from(ctx)), c_(EmbeddingConfig::parse(cfg, ctx.node_name)) {
    tp_.divisible(c_.num, "num");
    require(!c_.attend_bias, tp_.node, "config key 'attend_bias' is for embedding (a table has no attend method)");
    std::string ids = config_get<std::string>(cfg, "ids", tp_.node, "replicated");
    require(ids == "replicated" || ids == "distinct", tp_.node,
            "config key 'ids' must be \"replicated\" or \"distinct\", got \"" + ids + "\"");
    distinct_ = ids == "distinct";
    InitStream gen(ctx.init_seed);
    weight_ = param(normal(gen, {c_.num, c_.dim}, c_.init_std, Slice::part(0, c_.num, tp_.rank, tp_.size)));
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 1, tp_.node, call.method);
    expect_ids(call.inputs[0], c_.num, tp_.node);
    return {ShardedLookupFn::apply(weight_, call.inputs[0], smp::sdk::comm_id(tp_.comm), c_.num / tp_.size,
                                   distinct_ ? 1 : 0)};
  }
  std::vector<Param> parameters() override { return {{"weight", weight_, 0, false}}; }

 private:
  Tp tp_;
  EmbeddingConfig c_;
  bool distinct_ = false;
  Tensor weight_;
};

// select along the sequence under sequence parallelism: the activation is
// [b, s/t, ...] per rank, so the sequence is all-gathered first and the output is
// whole on every rank. What consumes it is replicated (every rank computes the
// same gradient), so backward keeps this rank's slice rather than summing.
// Under parallel.cp the gathered sequence is this rank's cp share, and Select
// picks the global position there (smp_nn's Select).
class DistSelect : public Module {
 public:
  DistSelect(const Json& cfg, const ModuleContext& ctx) : tp_(Tp::from(ctx)), select_(cfg, ctx) {}
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 1, tp_.node, call.method);
    Tensor x = call.inputs[0];
    if (tp_.sp && (select_.dim() == 1 || select_.dim() == 1 - x.dim())) {
      tp_.check_seq(x, false);
      x = smp::sdk::gather_from_region(x, tp_.comm, 1);
    }
    return {select_.select(x)};
  }

 private:
  Tp tp_;
  Select select_;
};

}  // namespace smp_tp
