// parallel_moe: smp_nn's moe with its experts split over the mesh's ep axis
// (each ep rank holds experts / ep of them; tokens travel by all-to-all, counts
// first) and, under tp, either split over tp too (expert_tp = true: each rank
// holds ffn / tp of every local expert's columns, Megatron's expert tensor
// parallelism) or whole on every tp rank, which then takes its own share of
// the tokens (expert_tp = false).
//
// Token sets under tp (t ranks):
//   sequence parallel: each rank routes its own s / t positions;
//   no sequence parallelism, expert_tp = false: each rank routes and computes
//     its s / t positions of the replicated activation, then all-gathers;
//   no sequence parallelism, expert_tp = true: every rank routes every token
//     (the same way) and computes its partial sums, all-reduced.
// When a rank routes only part of each sequence ("split"), the router's
// gradient is partial over tp and the per-sequence statistics are summed
// over tp first, so routing, dropping and the losses equal the serial run's.
#pragma once

#include <smp_nn/moe.hpp>
#include <smp_tp/modules.hpp>

namespace smp_tp {

class ParallelMoe : public Module {
 public:
  ParallelMoe(const Json& cfg, const ModuleContext& ctx)
      : tp_(Tp::from(ctx)), c_(MoeConfig::parse(cfg, ctx.node_name)), ep_(ctx.comm("ep")) {
    const int n = ctx.axis_size("ep");
    if (ep_.size() != n || ep_.rank() != ctx.axis_rank("ep"))
      throw smp::sdk::Error("node '" + tp_.node + "': the ep communicator disagrees with the mesh");
    if (c_.experts % n != 0)
      throw smp::sdk::Error("node '" + tp_.node + "': experts " + std::to_string(c_.experts) +
                            " not divisible by ep " + std::to_string(n));
    et_ = c_.expert_tp && tp_.size > 1;
    // No deferral where it would break a contract: a zero-bubble schedule
    // splits backward into an input pass (restricted to the stage's inputs)
    // and a weight pass; ZeRO-3 issues its gathers and reduce-scatters on dp
    // in the order gradients complete, which deferral would make differ
    // between ranks (each fills its own waits).
    defer_ok_ = ctx.parallel.value("schedule", std::string("1f1b")) != "zb-h1" && ctx.parallel.value("zero", 0) < 3;
    split_ = tp_.size > 1 && (tp_.sp || !et_);
    if (et_) tp_.divisible(c_.ffn, "ffn (expert_tp)");
    if (c_.shared_experts > 0) tp_.divisible(c_.shared().ffn, "shared experts' ffn");
    const int64_t local = c_.experts / n;
    InitStream gen(ctx.init_seed);
    p_ = init_moe(gen, c_, ep_.rank() * local, local, tp_.rank, tp_.size, et_);
    make_params(p_);
  }

  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, tp_.node);
    expect_inputs(call.inputs, 1, 2, tp_.node, call.method);
    Tensor x = call.inputs[0];
    expect_dim(x, 3, c_.hidden, tp_.node, "input");
    check_moe_decodable(c_, call, tp_.node);
    tp_.refuse_sp_decode(call);
    if (split_ && call.decode)
      throw smp::sdk::Error("node '" + tp_.node + "': expert_tp = false splits each sequence's tokens over tp, and "
                            "a decoding call feeds one new position: generate with expert_tp = true");
    const int64_t b = x.size(0), h = x.size(2), k = c_.top_k;
    const smp::sdk::Comm& tp = tp_.comm;
    // The experts' weight gradients wait for exchanges that would wait
    // (smp_nn/deferred_grads.hpp): with ep > 1, in a backward pass that will
    // run. A chain starts at the first moe layer of the graph (no stats in,
    // or stats from outside it: another stage, a recomputed segment's input).
    const bool chain_start = call.inputs.size() == 1 || !call.inputs[1].grad_fn();
    const bool can_defer = defer_ok_ && ep_.size() > 1 && call.training && at::GradMode::is_enabled() && x.requires_grad();
    if (chain_start) x = smp_nn::start_deferral_chain(x, can_defer, tp_.node);
    const bool defer = can_defer && smp_nn::DeferredWeightGrads::current().armed;
    // This rank's tokens for routing.
    TokenSlice ts;
    ts.tp = tp;
    ts.split = split_;
    Tensor xt = x;
    if (tp_.sp) {
      tp_.check_seq(x, false);
      ts.offset = tp_.seq_offset(x.size(1)), ts.full_seq = tp_.full_seq(x.size(1));
    } else if (split_) {
      tp_.check_seq(x, true);
      xt = smp::sdk::scatter_to_region(x, tp, 1);
      ts.offset = tp_.rank * xt.size(1), ts.full_seq = x.size(1);
    } else {
      ts.full_seq = x.size(1);
    }
    Routing r = route(xt, p_.router, c_, ts, call.training, call.rng_seed);
    double mb = 0, ms = 0;
    // The shared experts compute while the routed rows travel.
    Tensor shared;
    auto shared_experts = [&] {
      if (c_.shared_experts > 0)
        shared = parallel_swiglu_mlp_forward(p_.shared, c_.shared(), tp_, x, call.training, call.rng_seed);
    };
    auto run = [&](const Tensor& tokens, const Tensor& experts, const Tensor& gates, const Tensor& keep) {
      const int64_t s = tokens.size(1);
      return dispatch_combine(
                 tokens.reshape({b * s, h}), experts.reshape({b * s, k}), gates.reshape({b * s, k}),
                 keep.defined() ? keep.reshape({b * s, k}) : Tensor(), c_.experts, ep_,
                 [&](const Tensor& rows, const std::vector<int64_t>& counts) {
                   return experts_mlp(p_, c_, rows, counts, defer);
                 },
                 &mb, &ms, shared_experts)
          .reshape({b, s, h});
    };
    Tensor y;
    if (et_) {
      // Every tp rank computes its ffn columns for every token of the sequences.
      Tensor experts = r.experts, keep = r.keep, gates;
      if (tp_.sp) {
        experts = smp::sdk::detail::gather_along(experts, 1, tp);
        if (keep.defined()) keep = smp::sdk::detail::gather_along(keep.to(at::kByte), 1, tp).to(at::kBool);
        gates = smp::sdk::gather_from_sequence(r.gates, tp, 1);  // backward sums the partial gate gradients
      } else {
        gates = smp::sdk::copy_to_region(r.gates, tp);
      }
      y = tp_.exit(run(tp_.enter(x), experts, gates, keep));
    } else {
      y = run(xt, r.experts, r.gates, r.keep);
      if (split_ && !tp_.sp) y = smp::sdk::gather_from_region(y, tp, 1);
    }
    if (shared.defined()) y = y + shared;
    return {y, chain_stats(call.inputs, r.stats + a2a_stats(mb, ms, x.options()))};
  }

  std::vector<Param> parameters() override {
    const bool partial = tp_.size > 1 && !et_;  // whole experts fed this rank's tokens only
    std::vector<Param> out{{"router.weight", p_.router, -1, split_}};
    auto expert = [&](const char* name, const Tensor& t, int ffn_dim) {
      Param q{name, t, et_ ? ffn_dim : -1, partial};
      q.placements = {smp::sdk::Placement::shard("ep", 0)};
      out.push_back(q);
    };
    expert("experts.gate", p_.gate, 1);
    if (p_.up.defined()) expert("experts.up", p_.up, 1);
    expert("experts.down", p_.down, 2);
    if (p_.shared.gate.weight.defined()) add_swiglu_params(out, "shared.", p_.shared, tp_.sp);
    return out;
  }

 private:
  Tp tp_;
  MoeConfig c_;
  smp::sdk::Comm ep_;
  bool et_ = false, split_ = false;
  bool defer_ok_ = true;  // deferred expert weight gradients (not under zero-bubble or ZeRO-3)
  MoeParams p_;
};

}  // namespace smp_tp
