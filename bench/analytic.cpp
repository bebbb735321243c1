#include "analytic.h"

namespace bench {

using nlohmann::json;

int64_t param_count(const Shape& m) {
  const int64_t h = m.hidden;
  const int64_t per_layer = 4 * h + 4 * (h * h + h) + (m.ffn * h + m.ffn) + (h * m.ffn + h);  // 2 LN, q/k/v/out, fc, proj
  return m.vocab * h + m.seq * h + m.layers * per_layer + 2 * h;  // wte (tied head), wpe, blocks, ln_f
}

double megatron_flops(const Shape& m, int64_t batch) {
  const double h = static_cast<double>(m.hidden), s = static_cast<double>(m.seq), l = static_cast<double>(m.layers),
               V = static_cast<double>(m.vocab);
  return 72.0 * static_cast<double>(batch) * s * l * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * l * h));
}

double ring_allreduce(double bytes, int n) { return n <= 1 ? 0.0 : 2.0 * (n - 1) / n * bytes; }

json dp_bytes_per_step(const Shape& m, int dp) {
  const double grads = ring_allreduce(4.0 * static_cast<double>(param_count(m)), dp);
  const double loss = ring_allreduce(8.0, dp);  // one double; exact for dp = 2 (8 bytes from rank 0)
  return {{"dp", {{"allreduce", grads + loss}}},
          {"terms", {{"gradients_2(n-1)/n*param_bytes", grads}, {"loss_allreduce", loss}}},
          {"total_dp", grads + loss}};
}

json pp_bytes_per_step_rank0(const Shape& m, int64_t micro_batch, int microbatches, int p, int v) {
  const double act = 4.0 * static_cast<double>(micro_batch * m.seq * m.hidden);
  const int S = p * v;
  double headers = 0, acts = 0, grads = 0;
  for (int c = 0; c < v; ++c) {
    const int stage = c * p;  // rank 0's virtual stages
    if (stage < S - 1) headers += 2048.0 * microbatches, acts += act * microbatches;
    if (stage > 0) grads += act * microbatches;
  }
  const double tied = ring_allreduce(4.0 * static_cast<double>(m.vocab * m.hidden), 2);
  return {{"pp", {{"send", headers + acts + grads}}},
          {"tied.wte", {{"allreduce", tied}}},
          {"mp", {{"allreduce", ring_allreduce(16.0, p)}}},
          {"terms",
           {{"activation_headers", headers}, {"activations", acts}, {"activation_grads", grads}, {"tied_wte_grad", tied}}},
          {"total_pp", headers + acts + grads}};
}

json tp_bytes_per_step(const Shape& m, int64_t batch, int t, bool sp) {
  const double A = 4.0 * static_cast<double>(batch * m.seq * m.hidden);
  const double N = static_cast<double>(batch * m.seq);
  const double per_ar = ring_allreduce(A, t);
  const double n_act = 4.0 * static_cast<double>(m.layers) + 2.0;
  const double acts = n_act * per_ar;
  const double ce = ring_allreduce(4.0 * N, t) + ring_allreduce(8.0 * N, t);
  const double h = static_cast<double>(m.hidden);
  const double replicated = 4.0 * (static_cast<double>(m.seq) * h + static_cast<double>(m.layers) * 6.0 * h + 2.0 * h);
  const double sp_grads = sp ? ring_allreduce(replicated, t) : 0.0;
  json ops;
  if (!sp) {
    ops = {{"allreduce", acts + ce}};
  } else {
    // each activation collective: half as reduce-scatter, half as all-gather (t = 2: A/2 each)
    ops = {{"reduce_scatter", acts / 2}, {"allgather", acts / 2}, {"allreduce", ce + sp_grads}};
  }
  return {{"tp", ops},
          {"mp", {{"allreduce", ring_allreduce(16.0, t)}}},
          {"terms",
           {{"activation_collectives", acts},
            {"activation_collective_count", n_act},
            {"bytes_per_activation_collective_pair", per_ar},
            {"vocab_parallel_ce", ce},
            {"sp_replicated_param_grads", sp_grads}}},
          {"total_tp", acts + ce + sp_grads}};
}

}  // namespace bench
