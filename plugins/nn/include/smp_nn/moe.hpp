// A mixture-of-experts MLP (Shazeer et al. 2017; Switch, GShard, Mixtral,
// DeepSeek-MoE), written once for the serial kind (smp_nn's moe: every expert
// here) and the expert-parallel kind (smp_tp's parallel_moe: experts over ep,
// optionally split over tp).
//
// Per token: router logits (fp32), top-k experts with gates (softmax over the
// k chosen logits, or softmax first and the chosen probabilities), optional
// capacity dropping, then the chosen experts' MLPs as grouped GEMMs over the
// tokens sorted by expert, weighted by the gates and summed; plus optional
// shared experts that see every token (DeepSeek-MoE).
//
// Statistics and capacity are per sequence (GShard's group = one sample), not
// per microbatch: a sample is never split between data-parallel ranks or
// microbatches, so every layout routes, drops and balances exactly as the
// serial run does. Under tp a sequence split over ranks sums its statistics
// over tp first.
#pragma once

#include <smp_nn/deferred_grads.hpp>
#include <smp_nn/modules.hpp>

#include <smp/sdk/collectives.hpp>

#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace smp_nn {

// moe {hidden, experts, top_k=2, ffn=4*hidden (each expert's), mlp="swiglu"|"gelu",
//      capacity_factor=0 (0: dropless), router="topk_softmax"|"softmax_topk",
//      router_jitter=0, aux_loss_weight=0.01, z_loss_weight=0, shared_experts=0,
//      init_std=0.02, out_init_std=init_std, expert_tp=true (read by parallel_moe)}
struct MoeConfig {
  int64_t hidden, experts, top_k, ffn, shared_experts;
  bool swiglu, softmax_first, expert_tp;
  double capacity_factor, jitter, aux_weight, z_weight, init_std, out_init_std;
  static MoeConfig parse(const Json& c, const std::string& node) {
    expect_node_keys(c, {"hidden", "experts", "top_k", "ffn", "mlp", "capacity_factor", "router", "router_jitter",
                         "aux_loss_weight", "z_loss_weight", "shared_experts", "init_std", "out_init_std", "expert_tp"},
                     node);
    MoeConfig r;
    r.hidden = positive(c, "hidden", node);
    r.experts = positive(c, "experts", node);
    r.top_k = positive(c, "top_k", node, 2);
    require(r.top_k <= r.experts, node,
            "top_k " + std::to_string(r.top_k) + " exceeds experts " + std::to_string(r.experts));
    r.ffn = positive(c, "ffn", node, 4 * r.hidden);
    const std::string mlp = config_get<std::string>(c, "mlp", node, "swiglu");
    require(mlp == "swiglu" || mlp == "gelu", node, "config key 'mlp' must be \"swiglu\" or \"gelu\", got \"" + mlp + "\"");
    r.swiglu = mlp == "swiglu";
    const std::string router = config_get<std::string>(c, "router", node, "topk_softmax");
    require(router == "topk_softmax" || router == "softmax_topk", node,
            "config key 'router' must be \"topk_softmax\" or \"softmax_topk\", got \"" + router + "\"");
    r.softmax_first = router == "softmax_topk";
    r.capacity_factor = config_get<double>(c, "capacity_factor", node, 0.0);
    require(r.capacity_factor >= 0, node, "config key 'capacity_factor' must be >= 0 (0: dropless)");
    r.jitter = probability(c, "router_jitter", node);
    r.aux_weight = config_get<double>(c, "aux_loss_weight", node, 0.01);
    r.z_weight = config_get<double>(c, "z_loss_weight", node, 0.0);
    require(r.aux_weight >= 0 && r.z_weight >= 0, node, "aux_loss_weight and z_loss_weight must be >= 0");
    r.shared_experts = config_get<int64_t>(c, "shared_experts", node, 0);
    require(r.shared_experts >= 0, node, "config key 'shared_experts' must be >= 0");
    r.init_std = stddev(c, "init_std", node, 0.02);
    r.out_init_std = stddev(c, "out_init_std", node, r.init_std);
    r.expert_tp = config_get<bool>(c, "expert_tp", node, true);
    return r;
  }
  // Tokens one expert may take from one sequence of s tokens (capacity_factor > 0).
  int64_t capacity(int64_t s) const {
    return static_cast<int64_t>(std::ceil(capacity_factor * static_cast<double>(s * top_k) / static_cast<double>(experts)));
  }
  SwigluMlpConfig shared() const { return {hidden, shared_experts * ffn, false, 0.0, init_std, out_init_std}; }
};

// The statistics vector a moe node adds to its second input and outputs (a
// chain through the model's moe layers, pipeline stages included); moe_loss
// turns it into the loss term and the metrics. Element 0 is differentiable.
enum MoeStat : int64_t {
  kMoeLoss = 0,      // aux_loss_weight * s * sum of sequence aux losses + z_loss_weight * sum of lse^2
  kMoeAux,           // sum over sequences (and layers) of the Switch aux loss (1 = balanced)
  kMoeAuxCount,      // sequences x layers
  kMoeZ,             // sum over tokens of logsumexp(logits)^2
  kMoeZCount,        // tokens x layers
  kMoeDropped,       // (token, expert) assignments dropped by capacity
  kMoeAssigned,      // assignments (tokens x top_k)
  kMoeLoadMax,       // sum of the busiest expert's assignments
  kMoeLoadMean,      // sum of the mean assignments per expert
  kMoeA2aBytes,      // forward all-to-all bytes this rank sent to other ep ranks (rows and counts)
  kMoeA2aMs,         // forward all-to-all milliseconds on this rank
  kMoeMicrobatches,  // 1 per microbatch (set by the first layer)
  kMoeStats
};

// Experts' parameters: [E_local, f_local, h] in (gate and up, or fc) and
// [E_local, h, f_local] out; the router [E, h] is whole everywhere.
struct MoeParams {
  Tensor router, gate, up, down;  // gelu: gate is fc, up undefined
  SwigluMlpParams shared;
};

// Draws from the node's stream, in order: router [E, h], gate (fc) [E, f, h],
// up [E, f, h] (swiglu), down [E, h, f], then the shared experts as a
// swiglu_mlp of ffn shared_experts * ffn (tp-split like one). Experts
// [e0, e0 + n) and, under expert tp, ffn part tp_rank of tp_size are kept.
inline MoeParams init_moe(InitStream& s, const MoeConfig& c, int64_t e0, int64_t n, int tp_rank = 0, int tp_size = 1,
                          bool split_ffn = false) {
  const Slice experts{0, e0, n};
  auto ffn_part = [&](const Tensor& t, int64_t dim) {
    if (!split_ffn || tp_size == 1) return t;
    const int64_t f = t.size(dim) / tp_size;
    return t.narrow(dim, tp_rank * f, f).contiguous();
  };
  MoeParams p;
  p.router = normal(s, {c.experts, c.hidden}, c.init_std);
  p.gate = ffn_part(normal(s, {c.experts, c.ffn, c.hidden}, c.init_std, experts), 1);
  if (c.swiglu) p.up = ffn_part(normal(s, {c.experts, c.ffn, c.hidden}, c.init_std, experts), 1);
  p.down = ffn_part(normal(s, {c.experts, c.hidden, c.ffn}, c.out_init_std, experts), 2);
  if (c.shared_experts > 0) p.shared = init_swiglu_mlp(s, c.shared(), tp_rank, tp_size);
  return p;
}
inline void make_params(MoeParams& p) {
  param(p.router), param(p.gate), param(p.down);
  if (p.up.defined()) param(p.up);
  if (p.shared.gate.weight.defined()) make_params(p.shared);
}

namespace detail {
// y[rows of group g] = x[rows of group g] W_{g mod G}^T for groups of
// consecutive rows (G = w.size(0)): counts may list several rounds of the G
// weights, e.g. (source rank, local expert) segments in the order an
// all-to-all delivers them.
inline Tensor grouped_mm_rows(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts, bool transpose_w) {
  const int64_t out = transpose_w ? w.size(1) : w.size(2), G = w.size(0);
  Tensor y = at::empty({x.size(0), out}, x.options());
  int64_t row = 0;
  for (size_t g = 0; g < counts.size(); ++g) {
    if (counts[g] == 0) continue;
    const Tensor wg = w[static_cast<int64_t>(g) % G];
    Tensor yg = y.narrow(0, row, counts[g]);
    at::mm_out(yg, x.narrow(0, row, counts[g]), transpose_w ? wg.t() : wg);
    row += counts[g];
  }
  return y;
}
// dW of a grouped GEMM (dW_e = sum over e's segments of dY_s^T X_s), one
// segment per step so that a deferred one can stop between them.
struct GroupedWeightGrad {
  Tensor gy, x, gw;  // gy [N, out] contiguous, x [N, in], gw [G, out, in]
  std::vector<int64_t> counts;
  std::vector<bool> written;
  size_t next = 0;
  int64_t row = 0;
  GroupedWeightGrad(Tensor gy_, Tensor x_, const Tensor& w, std::vector<int64_t> c)
      : gy(std::move(gy_)), x(std::move(x_)), gw(at::zeros_like(w)), counts(std::move(c)),
        written(static_cast<size_t>(w.size(0)), false) {}
  void skip_empty() {
    while (next < counts.size() && counts[next] == 0) ++next;
  }
  // One segment; true when none is left.
  bool step() {
    skip_empty();
    if (next < counts.size()) {
      const int64_t e = static_cast<int64_t>(next) % gw.size(0), n = counts[next];
      Tensor gwe = gw[e];
      const Tensor a = gy.narrow(0, row, n).t(), b = x.narrow(0, row, n);
      if (written[static_cast<size_t>(e)])
        gwe.addmm_(a, b);  // a later round of the same weight
      else
        at::mm_out(gwe, a, b), written[static_cast<size_t>(e)] = true;
      row += n, ++next;
      skip_empty();
    }
    return next == counts.size();
  }
};
struct GroupedMm : torch::autograd::Function<GroupedMm> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x, const Tensor& w,
                        std::vector<int64_t> counts) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["counts"] = counts;
    return grouped_mm_rows(x, w, counts, true);
  }
  // dX (dX_g = dY_g W_g) now, and the dW work for the caller to run.
  static std::pair<Tensor, GroupedWeightGrad> input_grad(torch::autograd::AutogradContext* ctx, const Tensor& grad) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &x = saved[0], &w = saved[1];
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const Tensor gy = grad.contiguous();
    return {grouped_mm_rows(gy, w, counts, false), GroupedWeightGrad(gy, x, w, counts)};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    auto [gx, wg] = input_grad(ctx, g[0]);
    while (!wg.step()) {
    }
    return {gx, wg.gw, Tensor()};
  }
};
// The grouped GEMM with its weight gradient left to the thread's
// DeferredWeightGrads: w comes detached, the parameter by ParamRef, which
// receives the gradient when the task completes.
struct DeferredGroupedMm : torch::autograd::Function<DeferredGroupedMm> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x, const Tensor& w,
                        std::vector<int64_t> counts, ParamRef p) {
    ctx->saved_data["param"] = p.param;
    return GroupedMm::forward(ctx, x, w, std::move(counts));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    check_unrestricted_backward();
    auto [gx, weight_grad] = GroupedMm::input_grad(ctx, g[0]);
    auto wg = std::make_shared<GroupedWeightGrad>(std::move(weight_grad));
    DeferredWeightGrads::current().add([wg, param = ctx->saved_data["param"].toTensor()] {
      if (!wg->step()) return false;
      torch::autograd::backward({param}, {wg->gw});  // AccumulateGrad and its hooks, as autograd would
      return true;
    });
    return {gx, Tensor(), Tensor(), Tensor()};
  }
};
// An exchange's event, with deferred weight-gradient steps run while it is
// not ready.
inline void wait_filling(smp::sdk::Event& e) {
  DeferredWeightGrads::current().run_while([&] { return !e.ready(); });
  e.wait();
}
// The SDK's all-to-all (the reverse one backward), whose backward exchange
// runs deferred weight gradients while it waits: the experts' combine.
struct CombineAllToAll : torch::autograd::Function<CombineAllToAll> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x, int64_t comm,
                        std::vector<int64_t> in_splits, std::vector<int64_t> out_splits) {
    return smp::sdk::detail::AllToAll::forward(ctx, x, comm, std::move(in_splits), std::move(out_splits));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {reverse_alltoall_filling(ctx, g[0]), Tensor(), Tensor(), Tensor()};
  }
  static Tensor reverse_alltoall_filling(torch::autograd::AutogradContext* ctx, const Tensor& grad) {
    const Tensor gy = grad.contiguous();
    Tensor gx;
    smp::sdk::Event e = smp::sdk::detail::comm_of(ctx).alltoall_async(
        gy, gx, ctx->saved_data["out_splits"].toIntVector(), ctx->saved_data["in_splits"].toIntVector());
    wait_filling(e);
    return gx;
  }
};
// The rows an all-to-all already delivered (`received`), joined to the graph
// of the rows sent (x): backward sends the gradient back by the reverse
// all-to-all. Lets the forward exchange run while other work computes.
struct DeliveredAllToAll : torch::autograd::Function<DeliveredAllToAll> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& /*x*/, const Tensor& received,
                        int64_t comm, std::vector<int64_t> in_splits, std::vector<int64_t> out_splits) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["in_splits"] = in_splits;
    ctx->saved_data["out_splits"] = out_splits;
    return received.view_as(received);
  }
  // The reverse all-to-all (deferred weight gradients run while it waits),
  // with no gradient for `received`.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    return {CombineAllToAll::reverse_alltoall_filling(ctx, g[0]), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};
}  // namespace detail

// The grouped GEMM of MoE experts: x [N, in] with rows sorted by group
// (counts[g] rows for group g, which uses weight g mod G), w [G, out, in] ->
// [N, out], one GEMM per non-empty group into its rows of one output, and the
// same in backward (no gathers, masks or per-expert copies).
inline Tensor grouped_mm(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts) {
  return detail::GroupedMm::apply(x.contiguous(), w, counts);
}

// The experts' MLP on rows in groups of local experts (counts: one or more
// rounds over the local experts, see grouped_mm). Under expert tp the result
// is this rank's partial sum (its ffn columns).
// `defer`: the weight gradients go to the thread's DeferredWeightGrads.
inline Tensor experts_mlp(const MoeParams& p, const MoeConfig& c, const Tensor& x, const std::vector<int64_t>& counts,
                          bool defer = false) {
  auto mm = [&](const Tensor& in, const Tensor& w) {
    return defer ? detail::DeferredGroupedMm::apply(in.contiguous(), w.detach(), counts, detail::ParamRef{w})
                 : grouped_mm(in, w, counts);
  };
  if (!c.swiglu) return mm(gelu_tanh(mm(x, p.gate)), p.down);
  return mm(at::silu(mm(x, p.gate)) * mm(x, p.up), p.down);
}

// Where this rank's tokens sit in their sequences, and the group (tp) that
// holds the rest of each sequence when it is split.
struct TokenSlice {
  smp::sdk::Comm tp;      // used when split
  bool split = false;     // this rank holds [offset, offset + s_local) of every sequence
  int64_t offset = 0, full_seq = 0;
};

struct Routing {
  Tensor experts;  // [b, s', k] int64
  Tensor gates;    // [b, s', k] fp32, differentiable
  Tensor keep;     // [b, s', k] bool, undefined when dropless
  Tensor stats;    // [kMoeStats] fp32, element kMoeLoss differentiable
};

inline Routing route(const Tensor& x, const Tensor& router, const MoeConfig& c, const TokenSlice& ts, bool training,
                     uint64_t seed) {
  const int64_t b = x.size(0), sl = x.size(1), E = c.experts, k = c.top_k, S = ts.full_seq;
  Tensor xr = x.to(at::kFloat);
  if (training && c.jitter > 0) {  // multiplicative noise (Switch), drawn for whole sequences
    at::Generator gen = smp::sdk::init_generator(seed);
    Tensor noise = at::empty({b, S, x.size(2)}, at::kFloat).uniform_(1.0 - c.jitter, 1.0 + c.jitter, gen);
    xr = xr * noise.narrow(1, ts.offset, sl).to(x.device());
  }
  const Tensor logits = at::linear(xr, router.to(at::kFloat));  // [b, s', E]
  const Tensor probs = at::softmax(logits, -1);
  Routing r;
  if (c.softmax_first) {
    auto [v, i] = probs.topk(k, -1);
    r.gates = v, r.experts = i;
  } else {
    auto [v, i] = logits.topk(k, -1);
    r.gates = at::softmax(v, -1), r.experts = i;
  }
  auto tp_sum = [&](Tensor t) {  // a plain sum over the sequence's ranks
    if (ts.split) ts.tp.allreduce(t);
    return t;
  };
  // Switch's load-balancing loss per sequence: E / (S^2 k) * sum_e P_e c_e with
  // P_e the summed router probabilities and c_e the assignments to e.
  const Tensor oh = at::one_hot(r.experts.reshape({b, sl * k}), E);         // [b, s'k, E]
  const Tensor local_counts = oh.sum(1);                                  // [b, E], this rank's tokens
  const Tensor counts = tp_sum(local_counts.to(at::kFloat));              // [b, E], the whole sequences
  Tensor P = probs.sum(1);                                                // [b, E]
  if (ts.split) P = smp::sdk::reduce_from_region(P, ts.tp);
  const Tensor aux = (P * counts).sum() * (static_cast<double>(E) / static_cast<double>(S * S * k));
  Tensor z = at::logsumexp(logits, -1).pow(2).sum();
  if (ts.split) z = smp::sdk::reduce_from_region(z, ts.tp);
  const Tensor loss = aux * (c.aux_weight * static_cast<double>(S)) + z * c.z_weight;

  double dropped = 0;
  if (c.capacity_factor > 0) {
    // An assignment's place in its (sequence, expert) queue, tokens in order,
    // a token's k choices in order; the ranks before this one in the sequence first.
    Tensor pos = (oh.cumsum(1) - 1).mul(oh).sum(-1);  // [b, s'k]
    if (ts.split) {
      const Tensor all = ts.tp.allgather(local_counts.unsqueeze(0).contiguous());  // [tp, b, E]
      const int rank = ts.tp.rank();
      const Tensor before = rank > 0 ? all.narrow(0, 0, rank).sum(0) : at::zeros_like(all[0]);
      pos = pos + before.gather(1, r.experts.reshape({b, sl * k}));
    }
    r.keep = pos.lt(c.capacity(S)).reshape({b, sl, k});
    dropped = tp_sum(r.keep.logical_not().sum().to(at::kFloat).reshape({1})).item<double>();
  }
  const Tensor load = counts.sum(0);  // [E] over the microbatch
  const double tokens = static_cast<double>(b * S);
  Tensor stats = at::zeros({kMoeStats}, at::kFloat);
  auto st = stats.accessor<float, 1>();
  st[kMoeAux] = aux.item<float>();
  st[kMoeAuxCount] = static_cast<float>(b);
  st[kMoeZ] = z.item<float>();
  st[kMoeZCount] = static_cast<float>(tokens);
  st[kMoeDropped] = static_cast<float>(dropped);
  st[kMoeAssigned] = static_cast<float>(tokens * k);
  st[kMoeLoadMax] = load.max().item<float>();
  st[kMoeLoadMean] = static_cast<float>(tokens * k / E);
  // Element 0 carries the loss with its gradient.
  r.stats = at::cat({loss.reshape({1}), stats.narrow(0, 1, kMoeStats - 1).to(x.device())});
  return r;
}

// Moves each kept (token, expert) assignment's row to the ep rank holding the
// expert, runs `experts` on the rows in groups of local experts (counts: one
// per expert, or one per (source rank, local expert) in source order; see
// grouped_mm), and returns the gate-weighted sum per token [N, h]. x [N, h]; experts, gates, keep [N, k].
// `overlap` (optional) runs while the rows travel (the shared experts).
// a2a_bytes / a2a_ms: what this rank's forward all-to-alls sent, and the time
// it spent in them (waiting, not overlapped).
using ExpertsFn = std::function<Tensor(const Tensor& rows, const std::vector<int64_t>& counts)>;
inline Tensor dispatch_combine(const Tensor& x, const Tensor& experts, const Tensor& gates, const Tensor& keep,
                               int64_t num_experts, const smp::sdk::Comm& ep, const ExpertsFn& fn, double* a2a_bytes,
                               double* a2a_ms, const std::function<void()>& overlap = {}) {
  const int64_t N = x.size(0), k = experts.size(1);
  const auto lng = at::TensorOptions().dtype(at::kLong).device(x.device());
  Tensor e = experts.reshape({-1}), tok = at::arange(N, lng).repeat_interleave(k), g = gates.reshape({-1});
  if (keep.defined()) {
    const Tensor sel = keep.reshape({-1}).nonzero().squeeze(1);
    e = e.index_select(0, sel), tok = tok.index_select(0, sel), g = g.index_select(0, sel);
  }
  const Tensor order = std::get<1>(e.sort(/*stable=*/true, 0, false));
  const Tensor tok_sorted = tok.index_select(0, order);
  const Tensor counts_t = at::bincount(e.index_select(0, order).cpu(), {}, num_experts);
  const std::vector<int64_t> counts(counts_t.data_ptr<int64_t>(), counts_t.data_ptr<int64_t>() + num_experts);
  const Tensor xs = x.index_select(0, tok_sorted);
  Tensor ys;
  const int n = ep.size();
  if (n == 1) {
    if (overlap) overlap();
    ys = fn(xs, counts);
  } else {
    using clock = std::chrono::steady_clock;
    auto since = [](clock::time_point t) { return std::chrono::duration<double, std::milli>(clock::now() - t).count(); };
    auto t0 = clock::now();
    const int64_t local = num_experts / n;
    // Counts first: how many rows of each local expert every rank sends here.
    const std::vector<int64_t> per_rank(static_cast<size_t>(n), local);
    const Tensor recv_t = ep.alltoall(counts_t, per_rank, per_rank);  // [n * local], source-major
    std::vector<int64_t> send(static_cast<size_t>(n), 0), recv(static_cast<size_t>(n), 0);
    const int64_t* rc = recv_t.data_ptr<int64_t>();
    for (int j = 0; j < n; ++j)
      for (int64_t l = 0; l < local; ++l) {
        send[j] += counts[j * local + l];
        recv[j] += rc[j * local + l];
      }
    // The rows, asynchronously: `overlap` computes meanwhile.
    int64_t rows_in = 0;
    for (int64_t r : recv) rows_in += r;
    const Tensor sent = xs.detach().contiguous();
    Tensor received = at::empty({rows_in, xs.size(1)}, xs.options().requires_grad(false));
    smp::sdk::Event rows = ep.alltoall_async(sent, received, send, recv);
    *a2a_ms += since(t0);  // the counts exchange and the launch
    if (overlap) overlap();
    t0 = clock::now();
    rows.wait();
    *a2a_ms += since(t0);
    const Tensor xr = detail::DeliveredAllToAll::apply(xs, received, smp::sdk::comm_id(ep), send, recv);
    // Received rows come source-major, each source's sorted by local expert:
    // the experts run on them in place, one group per (source, expert)
    // segment, so nothing is permuted there and back.
    const std::vector<int64_t> segments(rc, rc + n * local);
    const Tensor yr = fn(xr, segments);
    t0 = clock::now();
    ys = detail::CombineAllToAll::apply(yr, smp::sdk::comm_id(ep), recv, send);
    *a2a_ms += since(t0);
    int64_t remote = 0, remote_back = 0;
    for (int j = 0; j < n; ++j)
      if (j != ep.rank()) remote += send[j], remote_back += recv[j];
    const double row_bytes = static_cast<double>(x.size(1) * x.element_size());
    *a2a_bytes += static_cast<double>(remote + remote_back) * row_bytes + static_cast<double>((n - 1) * local * 8);
  }
  ys = ys * g.index_select(0, order).unsqueeze(1).to(ys.scalar_type());
  return at::zeros({N, ys.size(1)}, ys.options()).index_add(0, tok_sorted, ys);
}

// The stats chain: the previous layers' (or none) plus this layer's.
inline Tensor chain_stats(const std::vector<Tensor>& inputs, Tensor mine) {
  if (inputs.size() > 1) return inputs[1] + mine;
  auto one = at::zeros({kMoeStats}, mine.options().dtype(at::kFloat).requires_grad(false));
  one[kMoeMicrobatches] = 1.0;
  return mine + one;
}
inline Tensor a2a_stats(double bytes, double ms, const at::TensorOptions& o) {
  Tensor t = at::zeros({kMoeStats}, at::kFloat);
  t[kMoeA2aBytes] = bytes, t[kMoeA2aMs] = ms;
  return t.to(o.device());
}

// A decoding call (ABI 2.7) feeds each sequence a new position at a time:
// capacity, counted per sequence, would then drop other tokens than the whole
// sequence does. Dropless routing is per token, so feeding fewer positions
// changes nothing.
inline void check_moe_decodable(const MoeConfig& c, const smp::sdk::Call& call, const std::string& node) {
  if (call.decode && c.capacity_factor > 0)
    throw smp::sdk::Error("node '" + node + "': capacity_factor " + c10::str(c.capacity_factor) +
                          " drops tokens per sequence, so a decoding call (one new position) would route otherwise "
                          "than the whole sequence: generate with capacity_factor = 0 (dropless)");
}

// The serial kind: every expert on this rank.
//   forward: x [b, s, h] (, stats [kMoeStats]) -> y [b, s, h], stats
class Moe : public smp::sdk::Module {
 public:
  Moe(const Json& cfg, const smp::sdk::ModuleContext& ctx) : node_(ctx.node_name), c_(MoeConfig::parse(cfg, node_)) {
    InitStream gen(ctx.init_seed);
    p_ = init_moe(gen, c_, 0, c_.experts);
    make_params(p_);
  }
  std::vector<Tensor> forward(const smp::sdk::Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 2, node_, call.method);
    const Tensor& x = call.inputs[0];
    expect_dim(x, 3, c_.hidden, node_, "input");
    check_moe_decodable(c_, call, node_);
    const int64_t b = x.size(0), s = x.size(1), h = x.size(2);
    TokenSlice ts;
    ts.full_seq = s;
    Routing r = route(x, p_.router, c_, ts, call.training, call.rng_seed);
    double mb = 0, ms = 0;
    const int64_t k = c_.top_k;
    Tensor y = dispatch_combine(
        x.reshape({b * s, h}), r.experts.reshape({b * s, k}), r.gates.reshape({b * s, k}),
        r.keep.defined() ? r.keep.reshape({b * s, k}) : Tensor(), c_.experts, smp::sdk::Comm(),
        [&](const Tensor& rows, const std::vector<int64_t>& counts) { return experts_mlp(p_, c_, rows, counts); }, &mb,
        &ms);
    y = y.reshape({b, s, h});
    if (c_.shared_experts > 0) y = y + swiglu_mlp_forward(p_.shared, c_.shared(), x, call.training, call.rng_seed);
    return {y, chain_stats(call.inputs, r.stats)};
  }
  std::vector<smp::sdk::Param> parameters() override {
    std::vector<smp::sdk::Param> out{{"router.weight", p_.router, -1, false}, {"experts.gate", p_.gate, -1, false}};
    if (p_.up.defined()) out.push_back({"experts.up", p_.up, -1, false});
    out.push_back({"experts.down", p_.down, -1, false});
    if (p_.shared.gate.weight.defined()) {
      out.push_back({"shared.gate.weight", p_.shared.gate.weight, -1, false});
      out.push_back({"shared.up.weight", p_.shared.up.weight, -1, false});
      out.push_back({"shared.down.weight", p_.shared.down.weight, -1, false});
    }
    return out;
  }

 private:
  std::string node_;
  MoeConfig c_;
  MoeParams p_;
};

// moe_loss {}: forward: loss_sum, stats -> loss_sum + stats[0] (in training;
// a validation loss is the model's alone), then stats[1..] as scalars, for
// graph.loss_sum and graph.metric (see MoeStat).
class MoeLoss : public smp::sdk::Module {
 public:
  MoeLoss(const Json& cfg, const smp::sdk::ModuleContext& ctx) : node_(ctx.node_name) { expect_node_keys(cfg, {}, node_); }
  std::vector<Tensor> forward(const smp::sdk::Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 2, 2, node_, call.method);
    const Tensor &loss = call.inputs[0], &stats = call.inputs[1];
    if (stats.dim() != 1 || stats.size(0) != kMoeStats)
      throw smp::sdk::Error("node '" + node_ + "': stats must be the [" + std::to_string(kMoeStats) +
                            "] vector a moe node outputs, got " + c10::str(stats.sizes()));
    std::vector<Tensor> out{call.training ? loss + stats[kMoeLoss].to(loss.scalar_type()) : loss};
    for (int64_t i = 1; i < kMoeStats; ++i) out.push_back(stats[i].detach());
    return out;
  }

 private:
  std::string node_;
};

}  // namespace smp_nn
