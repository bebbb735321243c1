// One rank of the tensor-parallel suite (spawned W times by tp_test.cpp).
//
//   smp_tp_test_worker [--sp]      env: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
//
// Connects a real Rendezvous (c10d TCPStore + Gloo over loopback), makes a "tp"
// communicator over all ranks, and for every smp_tp kind builds the serial smp_nn
// layer and the distributed layer from the same seed, runs forward + backward on the
// same data and compares outputs, input gradients and parameter gradients (this rank's
// slice of the serial ones; tp_grad_sum parameters after the sum over tp that the core
// does). Then 3 SGD steps of a small GPT-like stack, and the bytes the tp communicator
// sent against the analytic counts. Prints one line per check; exit code 0 = all pass.
#include <smp_tp/modules.hpp>

#include <smp/mesh.h>

#include "comm/communicator.h"
#include "plugin/host_api.h"

#include "comm/process_groups.h"

#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using at::Tensor;
using smp::sdk::Call;
using smp::sdk::Module;
using smp::sdk::ModuleContext;
using smp::sdk::Param;
using Json = nlohmann::json;

namespace {

constexpr double kAtol = 1e-5, kRtol = 1e-4;  // fp32; the tp sums run in another order

int g_rank = 0, g_t = 1, g_failures = 0, g_checks = 0;
bool g_sp = false;
smp::Communicator* g_comm = nullptr;
smp_mesh* g_mesh = nullptr;  // a 1 x 1 x W mesh: the tp axis is every rank

void say(const std::string& s) { std::printf("[rank %d] %s\n", g_rank, s.c_str()), std::fflush(stdout); }

bool expect(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) ++g_failures, say("FAIL " + what);
  return ok;
}
bool close(const std::string& what, const Tensor& got, const Tensor& want, double atol = kAtol, double rtol = kRtol) {
  ++g_checks;
  if (!got.defined() || !want.defined() || got.sizes() != want.sizes()) {
    ++g_failures;
    say("FAIL " + what + ": shapes " + (got.defined() ? c10::str(got.sizes()) : "undefined") + " vs " +
        (want.defined() ? c10::str(want.sizes()) : "undefined"));
    return false;
  }
  double err = got.numel() ? (got.detach() - want.detach()).abs().max().item<double>() : 0.0;
  bool ok = at::allclose(got.detach(), want.detach(), rtol, atol);
  if (!ok) {
    ++g_failures;
    say("FAIL " + what + ": max abs err " + std::to_string(err));
  }
  return ok;
}

ModuleContext serial_ctx(const std::string& name, uint64_t seed) {
  ModuleContext m;
  m.node_name = name;
  m.init_seed = seed;
  return m;
}
ModuleContext dist_ctx(const std::string& name, uint64_t seed) {
  ModuleContext m = serial_ctx(name, seed);
  m.tp_rank = g_rank;
  m.tp_size = g_t;
  m.tp = smp::sdk::Comm(g_comm->handle());
  m.sequence_parallel = g_sp;
  return m;
}

// How a dist tensor relates to the serial one.
enum class Lay { Full, Seq, Last };
Lay act() { return g_sp ? Lay::Seq : Lay::Full; }  // an activation between layers
Tensor slice(const Tensor& full, Lay l) {
  if (l == Lay::Full || full.dim() == 0) return full;
  int64_t dim = l == Lay::Seq ? 1 : full.dim() - 1;
  int64_t n = full.size(dim) / g_t;
  return full.narrow(dim, g_rank * n, n);
}

Tensor randn(at::IntArrayRef shape, uint64_t seed) {
  auto gen = smp::sdk::init_generator(seed);
  return at::empty(shape, at::kFloat).normal_(0, 1, gen);
}
Tensor randint(int64_t hi, at::IntArrayRef shape, uint64_t seed) {
  auto gen = smp::sdk::init_generator(seed);
  return at::randint(hi, shape, gen, at::TensorOptions().dtype(at::kLong));
}

std::map<std::string, Param> by_name(Module& m) {
  std::map<std::string, Param> out;
  for (auto& p : m.parameters()) out[p.name] = p;
  return out;
}
Tensor grad_or_zero(const Tensor& t) { return t.grad().defined() ? t.grad() : at::zeros_like(t); }

// The rank's view of a serial parameter (or its gradient).
Tensor param_slice(const Tensor& serial, int shard_dim) {
  if (shard_dim < 0) return serial;
  int64_t n = serial.size(shard_dim) / g_t;
  return serial.narrow(shard_dim, g_rank * n, n);
}

// Parameter values (init equivalence) and gradients of dist vs serial.
void compare_params(const std::string& name, Module& S, Module& D, bool values = true) {
  auto sp = by_name(S), dp = by_name(D);
  expect(sp.size() == dp.size(), name + ": " + std::to_string(dp.size()) + " dist params vs " +
                                     std::to_string(sp.size()) + " serial");
  for (auto& [pn, p] : dp) {
    auto it = sp.find(pn);
    if (!expect(it != sp.end(), name + ": dist param '" + pn + "' has no serial counterpart")) continue;
    const Tensor& s = it->second.tensor;
    if (values) close(name + " param " + pn, p.tensor, param_slice(s, p.shard_dim), 0, 0);
    Tensor g = grad_or_zero(p.tensor).clone();
    if (p.tp_grad_sum) g_comm->allreduce(g)->wait();
    close(name + " grad " + pn, g, param_slice(grad_or_zero(s), p.shard_dim));
    // Under SP every replicated parameter of these kinds sees only its sequence
    // slice; replicated kv heads (grouped-query attention) only their query heads.
    const bool kv = pn.rfind("k.") == pn.size() - 8 || pn.rfind("v.") == pn.size() - 8;  // "[..]k.weight"
    expect(p.tp_grad_sum == (p.shard_dim < 0 && (g_sp || kv)), name + ": tp_grad_sum of " + pn);
  }
}

struct Io {
  std::vector<Tensor> inputs;
  std::vector<Lay> lay;
};

// Forward + backward of serial S and dist D on the same data; compares output, input
// grads, parameter values and gradients.
void compare(const std::string& name, Module& S, Module& D, const Io& io, Lay out_lay, const std::string& method = "forward",
             bool training = false, uint64_t rng_seed = 0) {
  std::vector<Tensor> sin, din;
  for (size_t i = 0; i < io.inputs.size(); ++i) {
    const Tensor& x = io.inputs[i];
    bool fp = x.is_floating_point();
    sin.push_back(fp ? x.clone().requires_grad_(true) : x);
    Tensor d = slice(x, io.lay[i]).contiguous();
    din.push_back(fp ? d.clone().requires_grad_(true) : d);
  }
  Tensor so = S.forward(Call{method, sin, training, rng_seed})[0];
  Tensor dout = D.forward(Call{method, din, training, rng_seed})[0];
  close(name + " output", dout, slice(so, out_lay));
  Tensor w = so.dim() == 0 ? at::ones({}) : randn(so.sizes(), 977);
  (so * w).sum().backward();
  (dout * slice(w, out_lay)).sum().backward();
  for (size_t i = 0; i < sin.size(); ++i)
    if (sin[i].is_floating_point())
      close(name + " grad input " + std::to_string(i), grad_or_zero(din[i]), slice(grad_or_zero(sin[i]), io.lay[i]));
  compare_params(name, S, D);
}

// Two modules in sequence (for the Megatron column -> row pair); params "0.*", "1.*".
class Chain : public Module {
 public:
  Chain(std::unique_ptr<Module> a, std::unique_ptr<Module> b) : a_(std::move(a)), b_(std::move(b)) {}
  std::vector<Tensor> forward(const Call& c) override {
    Call c2 = c;
    c2.inputs = a_->forward(c);
    return b_->forward(c2);
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    for (auto p : a_->parameters()) p.name = "0." + p.name, out.push_back(p);
    for (auto p : b_->parameters()) p.name = "1." + p.name, out.push_back(p);
    return out;
  }

 private:
  std::unique_ptr<Module> a_, b_;
};

// ---- sizes (small: the suite must stay fast on 2 cores) ----
constexpr int64_t B = 2, S = 8, H = 16, HEADS = 4, FFN = 64, V = 32;

Json layer_cfg(double dropout = 0.0) {
  return {{"hidden", H}, {"heads", HEADS}, {"ffn", FFN}, {"causal", true}, {"dropout", dropout}, {"init_std", 0.2},
          {"out_init_std", 0.1}};
}
// The layer config without the keys a standalone attention / mlp does not take.
Json attention_cfg() {
  Json c = layer_cfg();
  c.erase("ffn");
  return c;
}
Json mlp_cfg() {
  Json c = layer_cfg();
  c.erase("heads"), c.erase("causal");
  return c;
}
Tensor pad_mask() {  // sample 1 has two padded positions at the end
  Tensor m = at::ones({B, S}, at::kLong);
  m[1][S - 1] = 0, m[1][S - 2] = 0;
  return m;
}

void check_linear() {
  Json col{{"in", H}, {"out", 2 * H}, {"init_std", 0.2}};
  Tensor x = randn({B, S, H}, 1);
  {
    smp_nn::Linear s(col, serial_ctx("lin", 5));
    smp_tp::TpLinear d(col, dist_ctx("lin", 5));
    compare("tp_linear column gather", s, d, {{x}, {act()}}, act());
  }
  {
    Json row = col;
    row["tp_mode"] = "row", row["in"] = 2 * H, row["out"] = H;
    Tensor x2 = randn({B, S, 2 * H}, 2);
    smp_nn::Linear s(row, serial_ctx("lin", 6));
    smp_tp::TpLinear d(row, dist_ctx("lin", 6));
    compare("tp_linear row", s, d, {{x2}, {act()}}, act());
  }
  for (bool bias : {true, false}) {
    Json a{{"in", H}, {"out", FFN}, {"bias", bias}, {"init_std", 0.2}, {"gather_output", false}};
    Json b{{"in", FFN}, {"out", H}, {"bias", !bias}, {"init_std", 0.2}, {"input_is_parallel", true}};
    Chain s(std::make_unique<smp_nn::Linear>(a, serial_ctx("a", 7)), std::make_unique<smp_nn::Linear>(b, serial_ctx("b", 8)));
    Chain d(std::make_unique<smp_tp::ColumnParallelLinear>(a, dist_ctx("a", 7)),
            std::make_unique<smp_tp::RowParallelLinear>(b, dist_ctx("b", 8)));
    compare(std::string("column->row pair, column bias ") + (bias ? "on" : "off"), s, d, {{x}, {act()}}, act());
  }
  {  // column without gather: output sharded on the last dim, full sequence
    Json a{{"in", H}, {"out", FFN}, {"init_std", 0.2}, {"gather_output", false}};
    smp_nn::Linear s(a, serial_ctx("a", 9));
    smp_tp::ColumnParallelLinear d(a, dist_ctx("a", 9));
    compare("column_parallel_linear no gather", s, d, {{x}, {act()}}, Lay::Last);
  }
}

void check_embedding_and_ce() {
  Json cfg{{"num", V}, {"dim", H}, {"init_std", 0.5}};
  Tensor ids = randint(V, {B, S}, 3);
  {
    smp_nn::Embedding s(cfg, serial_ctx("wte", 21));
    smp_tp::VocabParallelEmbedding d(cfg, dist_ctx("wte", 21));
    compare("vocab_parallel_embedding forward", s, d, {{ids}, {Lay::Full}}, act());
  }
  {
    smp_nn::Embedding s(cfg, serial_ctx("wte", 22));
    smp_tp::VocabParallelEmbedding d(cfg, dist_ctx("wte", 22));
    compare("vocab_parallel_embedding attend", s, d, {{randn({B, S, H}, 4)}, {act()}}, Lay::Last, "attend");
  }
  Tensor logits = randn({B, S, V}, 5).mul(3);
  Tensor targets = randint(V, {B, S}, 6);
  targets[0][2] = -100, targets[1][7] = -100;
  for (Json c : {Json::object(), Json{{"vocab", V}}}) {
    smp_nn::CrossEntropy s(c, serial_ctx("ce", 0));
    smp_tp::VocabParallelCrossEntropy d(c, dist_ctx("ce", 0));
    compare("vocab_parallel_cross_entropy " + c.dump(), s, d, {{logits, targets}, {Lay::Last, Lay::Full}}, Lay::Full);
  }
  {  // a non-negative ignore_index that some rank owns
    Json c{{"ignore_index", 1}};
    Tensor t2 = targets.clamp_min(0);
    t2[0][0] = 1, t2[1][1] = 1, t2[0][2] = 0;
    smp_nn::CrossEntropy s(c, serial_ctx("ce", 0));
    smp_tp::VocabParallelCrossEntropy d(c, dist_ctx("ce", 0));
    compare("vocab_parallel_cross_entropy ignore_index=1", s, d, {{logits, t2}, {Lay::Last, Lay::Full}}, Lay::Full);
  }
  {  // full logits (a gathered head) are recognised through config "vocab"
    Json c{{"vocab", V}};
    smp_nn::CrossEntropy s(c, serial_ctx("ce", 0));
    smp_tp::VocabParallelCrossEntropy d(c, dist_ctx("ce", 0));
    compare("vocab_parallel_cross_entropy full logits", s, d, {{logits, targets}, {Lay::Full, Lay::Full}}, Lay::Full);
  }
  {  // per-token weights (BERT's loss mask), both reductions
    Tensor w = at::rand({B, S}, smp::sdk::init_generator(7)).add(0.1);
    for (const char* reduction : {"mean", "sum"}) {
      Json c{{"reduction", reduction}};
      smp_nn::CrossEntropy s(c, serial_ctx("ce", 0));
      smp_tp::VocabParallelCrossEntropy d(c, dist_ctx("ce", 0));
      compare(std::string("vocab_parallel_cross_entropy weighted ") + reduction, s, d,
              {{logits, targets, w}, {Lay::Last, Lay::Full, Lay::Full}}, Lay::Full);
    }
  }
  {  // the tied decoder's bias, split with the vocabulary
    Json c{{"num", V}, {"dim", H}, {"init_std", 0.5}, {"attend_bias", true}};
    smp_nn::Embedding s(c, serial_ctx("wte", 23));
    smp_tp::VocabParallelEmbedding d(c, dist_ctx("wte", 23));
    compare("vocab_parallel_embedding attend with bias", s, d, {{randn({B, S, H}, 8)}, {act()}}, Lay::Last, "attend");
  }
  {  // the first token, whole on every rank (under SP gathered from rank 0's slice)
    Json c{{"dim", 1}, {"index", 0}};
    smp_nn::Select s(c, serial_ctx("first", 0));
    smp_tp::DistSelect d(c, dist_ctx("first", 0));
    compare("dist_select first token", s, d, {{randn({B, S, H}, 9)}, {act()}}, Lay::Full);
  }
}

void check_blocks() {
  Tensor x = randn({B, S, H}, 10);
  for (bool causal : {true, false}) {
    Json c = attention_cfg();
    c["causal"] = causal;
    smp_nn::Attention s(c, serial_ctx("attn", 31));
    smp_tp::ParallelAttention d(c, dist_ctx("attn", 31));
    Io io = causal ? Io{{x, pad_mask()}, {act(), Lay::Full}} : Io{{x}, {act()}};
    compare(std::string("parallel_attention ") + (causal ? "causal+padding" : "bidirectional"), s, d, io, act());
  }
  {  // rotary embedding: each rank turns its own heads by the whole sequence's positions
    Json c = attention_cfg();
    c["rope_base"] = 1000.0;
    smp_nn::Attention s(c, serial_ctx("attn", 40));
    smp_tp::ParallelAttention d(c, dist_ctx("attn", 40));
    compare("parallel_attention with rope", s, d, {{x, pad_mask()}, {act(), Lay::Full}}, act());
  }
  // Grouped-query attention: 2 kv heads split over tp 2 and replicate over tp 4
  // (their gradients then partial sums); 1 kv head (multi-query) replicates.
  for (int64_t kv : {2, 1}) {
    Json c = attention_cfg();
    c["kv_heads"] = kv, c["rope_base"] = 1000.0, c["bias"] = false;
    smp_nn::Attention s(c, serial_ctx("attn", 41));
    smp_tp::ParallelAttention d(c, dist_ctx("attn", 41));
    compare("parallel_attention kv_heads " + std::to_string(kv), s, d, {{x, pad_mask()}, {act(), Lay::Full}}, act());
  }
  {  // Llama's block
    Json c = layer_cfg();
    c["kv_heads"] = 2, c["rope_base"] = 1000.0, c["bias"] = false, c["norm_type"] = "rms_norm", c["mlp"] = "swiglu";
    smp_nn::TransformerLayer s(c, serial_ctx("blk", 42));
    smp_tp::ParallelTransformerLayer d(c, dist_ctx("blk", 42));
    compare("parallel_transformer_layer llama", s, d, {{x}, {act()}}, act());
  }
  {
    smp_nn::Mlp s(mlp_cfg(), serial_ctx("mlp", 32));
    smp_tp::ParallelMlp d(mlp_cfg(), dist_ctx("mlp", 32));
    compare("parallel_mlp", s, d, {{x}, {act()}}, act());
  }
  for (bool bias : {false, true}) {
    const Json c{{"hidden", H}, {"ffn", 2 * H}, {"bias", bias}, {"init_std", 0.3}};
    smp_nn::SwigluMlp s(c, serial_ctx("swiglu", 39));
    smp_tp::ParallelSwigluMlp d(c, dist_ctx("swiglu", 39));
    compare(std::string("parallel_swiglu_mlp") + (bias ? " with biases" : ""), s, d, {{x}, {act()}}, act());
  }
  {
    smp_nn::TransformerLayer s(layer_cfg(), serial_ctx("blk", 33));
    smp_tp::ParallelTransformerLayer d(layer_cfg(), dist_ctx("blk", 33));
    compare("parallel_transformer_layer", s, d, {{x, pad_mask()}, {act(), Lay::Full}}, act());
  }
  {  // post-LN (BERT), bidirectional with padding
    Json c = layer_cfg();
    c["norm"] = "post";
    c["causal"] = false;
    smp_nn::TransformerLayer s(c, serial_ctx("blk", 36));
    smp_tp::ParallelTransformerLayer d(c, dist_ctx("blk", 36));
    compare("parallel_transformer_layer post-LN bidirectional", s, d, {{x, pad_mask()}, {act(), Lay::Full}}, act());
  }  {  // BERT's pooled first token after a post-LN layer: under SP only rank 0's slice holds it
    Json c = layer_cfg();
    c["norm"] = "post";
    c["causal"] = false;
    Json first{{"dim", 1}, {"index", 0}};
    Chain s(std::make_unique<smp_nn::TransformerLayer>(c, serial_ctx("blk", 37)),
            std::make_unique<smp_nn::Select>(first, serial_ctx("first", 0)));
    Chain d(std::make_unique<smp_tp::ParallelTransformerLayer>(c, dist_ctx("blk", 37)),
            std::make_unique<smp_tp::DistSelect>(first, dist_ctx("first", 0)));
    compare("post-LN layer -> dist_select", s, d, {{x, pad_mask()}, {act(), Lay::Full}}, Lay::Full);
  }

  {  // dropout on: masks depend on (rng_seed, full shape) only, so tp drops the same elements
    smp_nn::TransformerLayer s(layer_cfg(0.2), serial_ctx("blk", 34));
    smp_tp::ParallelTransformerLayer d(layer_cfg(0.2), dist_ctx("blk", 34));
    compare("parallel_transformer_layer dropout 0.2 (training)", s, d, {{x, pad_mask()}, {act(), Lay::Full}}, act(),
            "forward", true, 4242);
  }
  {
    Json c{{"dim", H}};
    smp_nn::LayerNorm s(c, serial_ctx("ln", 35));
    smp_tp::DistLayerNorm d(c, dist_ctx("ln", 35));
    compare("dist_layer_norm", s, d, {{x.mul(2).add(1)}, {act()}}, act());
  }
  {
    Json c{{"dim", H}};
    smp_nn::RmsNorm s(c, serial_ctx("rms", 38));
    smp_tp::DistRmsNorm d(c, dist_ctx("rms", 38));
    compare("dist_rms_norm", s, d, {{x.mul(2).add(1)}, {act()}}, act());
  }
  {
    Json c{{"max_len", 2 * S}, {"dim", H}};
    smp_nn::PositionEmbedding s(c, serial_ctx("wpe", 36));
    smp_tp::DistPositionEmbedding d(c, dist_ctx("wpe", 36));
    compare("dist_position_embedding", s, d, {{x}, {act()}}, act());
  }
  {
    Json c{{"p", 0.3}};
    smp_nn::Dropout s(c, serial_ctx("drop", 0));
    smp_tp::DistDropout d(c, dist_ctx("drop", 0));
    compare("dist_dropout (training)", s, d, {{x}, {act()}}, act(), "forward", true, 99);
  }
}

void check_tables() {
  const int64_t num = 24, dim = 6;
  Json cfg{{"num", num}, {"dim", dim}, {"init_std", 1.0}};
  {  // replicated ids (a tp group): same batch on every rank
    smp_nn::EmbeddingTable s(cfg, serial_ctx("tab", 41));
    smp_tp::ShardedEmbeddingTable d(cfg, dist_ctx("tab", 41));
    compare("sharded_embedding_table replicated ids", s, d, {{randint(num, {B, 5}, 7)}, {Lay::Full}}, Lay::Full);
  }
  // distinct ids: rank j looks up its own n_j ids (uneven, some owners get none from some
  // ranks); serial = the lookup of every rank's ids, loss = sum over ranks.
  Json dcfg = cfg;
  dcfg["ids"] = "distinct";
  smp_nn::EmbeddingTable s(cfg, serial_ctx("tab", 42));
  smp_tp::ShardedEmbeddingTable d(dcfg, dist_ctx("tab", 42));
  auto ids_of = [&](int j) {
    int64_t n = 3 + 2 * j;
    return (at::arange(n, at::kLong) * (j + 1) * 5 + j * 7).remainder(j == 1 ? num / g_t : num);  // rank 1: owner 0 only
  };
  Tensor mine_out;
  Tensor serial_loss = at::zeros({});
  for (int j = 0; j < g_t; ++j) {
    Tensor o = s.forward(Call{"forward", {ids_of(j)}})[0];
    serial_loss = serial_loss + (o * randn(o.sizes(), 500 + j)).sum();
    if (j == g_rank) mine_out = o.detach();
  }
  serial_loss.backward();
  Tensor o = d.forward(Call{"forward", {ids_of(g_rank)}})[0];
  close("sharded_embedding_table distinct ids output", o, mine_out);
  (o * randn(o.sizes(), 500 + g_rank)).sum().backward();
  compare_params("sharded_embedding_table distinct ids", s, d);
  {  // the last rank looks nothing up (zero rows to and from every owner)
    smp_nn::EmbeddingTable s2(cfg, serial_ctx("tab", 43));
    smp_tp::ShardedEmbeddingTable d2(dcfg, dist_ctx("tab", 43));
    auto ids2 = [&](int j) { return j == g_t - 1 ? at::empty({0}, at::kLong) : ids_of(j); };
    Tensor sl = at::zeros({});
    for (int j = 0; j < g_t; ++j) {
      Tensor so = s2.forward(Call{"forward", {ids2(j)}})[0];
      sl = sl + (so * randn(so.sizes(), 600 + j)).sum();
    }
    sl.backward();
    Tensor od = d2.forward(Call{"forward", {ids2(g_rank)}})[0];
    expect(od.size(0) == ids2(g_rank).size(0) && od.size(1) == dim, "sharded_embedding_table empty ids shape");
    (od * randn(od.sizes(), 600 + g_rank)).sum().backward();
    compare_params("sharded_embedding_table distinct ids, one rank empty", s2, d2);
  }
  // 2-D ids, rank-distinct shapes
  Tensor o2 = d.forward(Call{"forward", {ids_of(g_rank).narrow(0, 0, 2).view({1, 2})}})[0];
  expect(o2.sizes() == at::IntArrayRef({1, 2, dim}), "sharded_embedding_table 2-D ids shape " + c10::str(o2.sizes()));
}

// ---- the same comparison through the built plugins and the C ABI ----
// A Module over a plugin's smp_module_kind: create/forward/parameters through handles.
class AbiModule : public Module {
 public:
  AbiModule(const smp_module_kind* k, const Json& cfg, const ModuleContext& c) : k_(k) {
    smp_module_context ctx{};
    ctx.struct_size = SMP_MODULE_CONTEXT_STRUCT_SIZE;
    ctx.node_name = c.node_name.c_str();
    ctx.init_seed = c.init_seed;
    ctx.device_type = SMP_DEVICE_CPU;
    // Serial contexts (tp size 1) get the one-rank mesh; distributed ones the job's.
    ctx.mesh = c.tp_size > 1 ? g_mesh : nullptr;
    ctx.parallel_json = "{}";
    // [tp] reaches the plugin's layers as the host hands it: SMP_EXTENSION_JOB_TABLES.
    const std::string tables = Json{{"tp", {{"sequence_parallel", c.sequence_parallel}}}}.dump();
    smp_job_tables_extension ext{};
    ext.base.struct_size = SMP_JOB_TABLES_EXTENSION_STRUCT_SIZE;
    ext.base.type = SMP_EXTENSION_JOB_TABLES;
    ext.base.version = 1;
    ext.tables_json = tables.c_str();
    ctx.extension_start = &ext.base;
    std::string js = cfg.dump();
    smp::throw_if_error(k->create(k->state, js.c_str(), &ctx, &m_), std::string("create ") + k->name);
  }
  ~AbiModule() override {
    if (m_) k_->destroy(m_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    std::vector<smp_tensor*> in;
    for (auto& t : call.inputs) in.push_back(smp::make_tensor_handle(t));
    smp_tensor* out = nullptr;
    smp_forward_args a{};
    a.struct_size = SMP_FORWARD_ARGS_STRUCT_SIZE;
    a.method = call.method.c_str();
    a.inputs = in.data();
    a.n_inputs = in.size();
    a.outputs = &out;
    a.n_outputs = 1;
    a.training = call.training ? 1 : 0;
    a.rng_seed = call.rng_seed;
    smp_error* err = k_->forward(m_, &a);
    for (auto* h : in) smp::host_api()->tensor_release(h);
    smp::throw_if_error(err, std::string("forward ") + k_->name);
    Tensor y = smp::tensor_of(out);
    smp::host_api()->tensor_release(out);
    return {y};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    smp::throw_if_error(k_->parameters(m_, &visit, &out), std::string("parameters ") + k_->name);
    return out;
  }

 private:
  // Back from ABI placements to the SDK's tp shorthands.
  static void visit(void* user, const smp_param_info* p) {
    Param out{p->name, smp::tensor_of(p->tensor)};
    for (size_t i = 0; i < p->n_placements; ++i) {
      const smp_placement& pl = p->placements[i];
      if (std::string(pl.axis) != "tp") continue;
      if (pl.kind == SMP_PLACEMENT_SHARD) out.shard_dim = pl.dim;
      if (pl.kind == SMP_PLACEMENT_PARTIAL_GRAD) out.tp_grad_sum = true;
    }
    static_cast<std::vector<Param>*>(user)->push_back(out);
  }
  const smp_module_kind* k_;
  smp_module* m_ = nullptr;
};

const smp_plugin_descriptor* load_plugin(const std::string& path) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw std::runtime_error(std::string("dlopen: ") + ::dlerror());
  auto entry = reinterpret_cast<smp_plugin_entry_fn>(::dlsym(lib, SMP_PLUGIN_ENTRY_SYMBOL));
  if (!entry) throw std::runtime_error("no entry symbol in " + path);
  smp_error* err = nullptr;
  const smp_plugin_descriptor* d = entry(smp::host_api(), &err);
  smp::throw_if_error(err, "loading " + path);
  return d;
}
const smp_module_kind* kind_of(const smp_plugin_descriptor* d, const std::string& name) {
  for (size_t i = 0; i < d->n_module_kinds; ++i)
    if (name == d->module_kinds[i]->name) return d->module_kinds[i];
  throw std::runtime_error(std::string("plugin ") + d->name + " has no kind " + name);
}
std::string rule_target(const smp_plugin_descriptor* d, const std::string& kind) {
  for (size_t i = 0; i < d->n_rules; ++i)
    if (kind == d->rules[i]->kind && std::string(d->rules[i]->axis) == "tp") return d->rules[i]->dist_kind;
  throw std::runtime_error(std::string("plugin ") + d->name + " has no rule for " + kind);
}

void check_through_abi() {
  const smp_plugin_descriptor* nn = load_plugin(std::string(SMP_PLUGIN_DIR) + "/smp_nn.so");
  const smp_plugin_descriptor* tp = load_plugin(std::string(SMP_PLUGIN_DIR) + "/smp_tp.so");
  Tensor x = randn({B, S, H}, 14);
  {  // the rule's target, as the core would pick it
    AbiModule s(kind_of(nn, "transformer_layer"), layer_cfg(0.1), serial_ctx("h.0", 71));
    AbiModule d(kind_of(tp, rule_target(tp, "transformer_layer")), layer_cfg(0.1), dist_ctx("h.0", 71));
    compare("ABI transformer_layer -> " + rule_target(tp, "transformer_layer"), s, d,
            {{x, pad_mask()}, {act(), Lay::Full}}, act(), "forward", true, 17);
  }
  {
    Json c{{"num", V}, {"dim", H}};
    AbiModule s(kind_of(nn, "embedding"), c, serial_ctx("wte", 72));
    AbiModule d(kind_of(tp, rule_target(tp, "embedding")), c, dist_ctx("wte", 72));
    compare("ABI embedding attend", s, d, {{x}, {act()}}, Lay::Last, "attend");
  }
  // the out-of-tree-style plugin: its own kind, its own rule, SDK collectives only
  const smp_plugin_descriptor* tpp = load_plugin(std::string(SMP_TEST_PLUGIN_DIR) + "/smp_third_party_rule.so");
  Json c{{"in", H}, {"out", 2 * H}, {"scale", 0.5}};
  AbiModule s(kind_of(tpp, "scaled_linear"), c, serial_ctx("ext", 73));
  AbiModule d(kind_of(tpp, rule_target(tpp, "scaled_linear")), c, dist_ctx("ext", 73));
  compare("third-party scaled_linear -> scaled_linear_tp", s, d, {{x}, {Lay::Full}}, Lay::Full);
}

// ---- communication volume ----
// ABI 2.4's communication extension through the SDK: a ring of sends and
// receives (one as events), an asynchronous broadcast whose on-ready callback
// runs off this thread before the event goes, and waits with completion modes.
void check_sdk_point_to_point() {
  smp::sdk::Comm c(g_comm->handle());
  const int next = (g_rank + 1) % g_t, prev = (g_rank + g_t - 1) % g_t;
  Tensor mine = at::full({5}, static_cast<float>(g_rank)), got = at::zeros({5});
  // Even ranks send first: blocking point-to-point in a ring needs an order.
  if (g_rank % 2 == 0) {
    c.send(mine, next, 3);
    c.recv(got, prev, 3);
  } else {
    smp::sdk::Event in = c.recv_async(got, prev, 3);
    smp::sdk::Event out = c.send_async(mine, next, 3);
    in.wait(SMP_COMPLETION_HOST);
    out.wait(SMP_COMPLETION_STREAM);
  }
  expect(at::equal(got, at::full({5}, static_cast<float>(prev))), "ring send/recv carries the previous rank's value");
  Tensor b = g_rank == g_t - 1 ? at::arange(6, at::kFloat) : at::zeros({6});
  std::atomic<int> fired{0};
  std::atomic<bool> on_this_thread{false};
  const auto me = std::this_thread::get_id();
  {
    smp::sdk::Event e = c.broadcast_async(b, g_t - 1);
    e.on_ready([&](const std::string& err) {
      if (std::this_thread::get_id() == me) on_this_thread = true;
      if (err.empty()) ++fired;
    });
    e.wait();
  }  // destroyed: after the callback
  expect(at::equal(b, at::arange(6, at::kFloat)), "asynchronous broadcast from the last rank");
  expect(fired == 1 && !on_this_thread, "the on-ready callback ran once, off the training thread");
}

int64_t allreduce_bytes(int64_t numel) { return 2 * (g_t - 1) * numel * 4 / g_t; }  // ring, numel % t == 0
int64_t allgather_bytes(int64_t numel_in) { return (g_t - 1) * numel_in * 4; }
int64_t reduce_scatter_bytes(int64_t numel_in) { return (g_t - 1) * numel_in * 4 / g_t; }

void expect_traffic(const std::string& what, std::map<std::string, int64_t> want_bytes,
                    std::map<std::string, int64_t> want_calls) {
  const smp::CommStats& st = g_comm->stats();
  std::map<std::string, int64_t> got_bytes, got_calls;
  for (auto& [k, v] : st.analytic) if (v) got_bytes[k] = v;
  for (auto& [k, v] : st.calls) if (v) got_calls[k] = v;
  for (auto it = want_bytes.begin(); it != want_bytes.end();) it = it->second ? std::next(it) : want_bytes.erase(it);
  for (auto it = want_calls.begin(); it != want_calls.end();) it = it->second ? std::next(it) : want_calls.erase(it);
  auto dump = [](const std::map<std::string, int64_t>& m) { return Json(m).dump(); };
  expect(got_bytes == want_bytes && got_calls == want_calls,
         what + ": bytes " + dump(got_bytes) + " calls " + dump(got_calls) + ", expected bytes " + dump(want_bytes) +
             " calls " + dump(want_calls));
  if (got_bytes == want_bytes) say("traffic " + what + ": " + dump(got_bytes) + " " + dump(got_calls));
}

void check_layer_traffic() {
  const int64_t act = B * S * H;  // one [b, s, h] activation
  smp_tp::ParallelTransformerLayer d(layer_cfg(), dist_ctx("blk", 51));
  Tensor x = slice(randn({B, S, H}, 11), ::act()).contiguous().requires_grad_(true);
  g_comm->reset_stats();
  Tensor y = d.forward(Call{"forward", {x}})[0];
  if (!g_sp)
    expect_traffic("transformer layer forward (2 all-reduces of b*s*h)", {{"allreduce", 2 * allreduce_bytes(act)}},
                   {{"allreduce", 2}});
  else
    expect_traffic("transformer layer forward SP (2 all-gathers + 2 reduce-scatters)",
                   {{"allgather", 2 * allgather_bytes(act / g_t)}, {"reduce_scatter", 2 * reduce_scatter_bytes(act)}},
                   {{"allgather", 2}, {"reduce_scatter", 2}});
  int64_t fwd = g_comm->stats().total_analytic();
  expect(fwd == 2 * allreduce_bytes(act), "layer forward bytes equal with and without SP");
  g_comm->reset_stats();
  y.sum().backward();
  if (!g_sp)
    expect_traffic("transformer layer backward", {{"allreduce", 2 * allreduce_bytes(act)}}, {{"allreduce", 2}});
  else
    expect_traffic("transformer layer backward SP",
                   {{"allgather", 2 * allgather_bytes(act / g_t)}, {"reduce_scatter", 2 * reduce_scatter_bytes(act)}},
                   {{"allgather", 2}, {"reduce_scatter", 2}});

  smp_tp::VocabParallelCrossEntropy ce(Json::object(), dist_ctx("ce", 0));
  Tensor logits = randn({B, S, V / g_t}, 12).requires_grad_(true);
  g_comm->reset_stats();
  Tensor loss = ce.forward(Call{"forward", {logits, randint(V, {B, S}, 13)}})[0];
  loss.backward();
  expect_traffic("vocab-parallel cross entropy fwd+bwd (max of b*s, then 2*b*s floats; no logits)",
                 {{"allreduce", allreduce_bytes(B * S) + allreduce_bytes(2 * B * S)}}, {{"allreduce", 2}});
}

// ---- a GPT-like stack, 3 SGD steps ----
struct Gpt {
  std::unique_ptr<Module> wte, wpe, l1, l2, lnf, ce;
  std::vector<Param> params() {
    std::vector<Param> out;
    for (Module* m : {wte.get(), wpe.get(), l1.get(), l2.get(), lnf.get()})
      for (auto& p : m->parameters()) out.push_back(p);
    return out;
  }
  Tensor loss(const Tensor& ids, const Tensor& mask, const Tensor& targets) {
    Tensor x = wte->forward(Call{"forward", {ids}})[0];
    x = wpe->forward(Call{"forward", {x}})[0];
    x = l1->forward(Call{"forward", {x, mask}})[0];
    x = l2->forward(Call{"forward", {x, mask}})[0];
    x = lnf->forward(Call{"forward", {x}})[0];
    Tensor logits = wte->forward(Call{"attend", {x}})[0];
    return ce->forward(Call{"forward", {logits, targets}})[0];
  }
};

template <class Emb, class Pos, class Layer, class Ln, class Ce>
Gpt make_gpt(ModuleContext (*ctx)(const std::string&, uint64_t)) {
  Gpt g;
  g.wte = std::make_unique<Emb>(Json{{"num", V}, {"dim", H}, {"init_std", 0.2}}, ctx("wte", 61));
  g.wpe = std::make_unique<Pos>(Json{{"max_len", S}, {"dim", H}, {"init_std", 0.1}}, ctx("wpe", 62));
  g.l1 = std::make_unique<Layer>(layer_cfg(), ctx("h.0", 63));
  g.l2 = std::make_unique<Layer>(layer_cfg(), ctx("h.1", 64));
  g.lnf = std::make_unique<Ln>(Json{{"dim", H}}, ctx("ln_f", 65));
  g.ce = std::make_unique<Ce>(Json{{"vocab", V}}, ctx("ce", 0));
  return g;
}

void sgd(std::vector<Param> params, double lr, bool dist) {
  c10::NoGradGuard ng;
  for (auto& p : params) {
    if (!p.tensor.grad().defined()) continue;
    Tensor g = p.tensor.grad();
    if (dist && p.tp_grad_sum) g_comm->allreduce(g)->wait();
    p.tensor.sub_(g, lr);
    p.tensor.mutable_grad().zero_();
  }
}

void check_gpt() {
  Gpt s = make_gpt<smp_nn::Embedding, smp_nn::PositionEmbedding, smp_nn::TransformerLayer, smp_nn::LayerNorm,
                   smp_nn::CrossEntropy>(&serial_ctx);
  Gpt d = make_gpt<smp_tp::VocabParallelEmbedding, smp_tp::DistPositionEmbedding, smp_tp::ParallelTransformerLayer,
                   smp_tp::DistLayerNorm, smp_tp::VocabParallelCrossEntropy>(&dist_ctx);
  const int64_t act = B * S * H;
  std::string losses;
  for (int step = 0; step < 3; ++step) {
    Tensor ids = randint(V, {B, S}, 70 + step), targets = randint(V, {B, S}, 80 + step);
    Tensor mask = pad_mask();
    targets.masked_fill_(mask.eq(0), -100);
    Tensor ls = s.loss(ids, mask, targets);
    g_comm->reset_stats();
    Tensor ld = d.loss(ids, mask, targets);
    if (step == 0) {  // forward traffic of the whole stack
      std::map<std::string, int64_t> bytes, calls;
      const int64_t ce_bytes = allreduce_bytes(B * S) + allreduce_bytes(2 * B * S);
      if (!g_sp) {  // embedding all-reduce, 2 per layer, CE's two small ones; attend's f sends nothing
        bytes = {{"allreduce", 5 * allreduce_bytes(act) + ce_bytes}};
        calls = {{"allreduce", 7}};
      } else {  // embedding RS, 2 x (AG + RS) per layer, attend AG: the same bytes as 5 all-reduces
        bytes = {{"allreduce", ce_bytes},
                 {"allgather", 5 * allgather_bytes(act / g_t)},
                 {"reduce_scatter", 5 * reduce_scatter_bytes(act)}};
        calls = {{"allreduce", 2}, {"allgather", 5}, {"reduce_scatter", 5}};
        expect(5 * allgather_bytes(act / g_t) + 5 * reduce_scatter_bytes(act) == 5 * allreduce_bytes(act),
               "SP moves the bytes of the all-reduces it replaces");
      }
      expect_traffic("GPT stack forward", bytes, calls);
    }
    close("GPT loss step " + std::to_string(step), ld, ls);
    losses += std::to_string(ls.item<double>()) + "/" + std::to_string(ld.item<double>()) + " ";
    ls.backward();
    ld.backward();
    if (step == 2) {
      for (auto& pr : std::vector<std::pair<Module*, Module*>>{{s.wte.get(), d.wte.get()}, {s.wpe.get(), d.wpe.get()},
                                                               {s.l1.get(), d.l1.get()}, {s.l2.get(), d.l2.get()},
                                                               {s.lnf.get(), d.lnf.get()}})
        compare_params("GPT step 2", *pr.first, *pr.second, false);
    }
    sgd(s.params(), 0.5, false);
    sgd(d.params(), 0.5, true);
  }
  // parameters after 3 steps
  for (auto& pr : std::vector<std::pair<Module*, Module*>>{{s.wte.get(), d.wte.get()}, {s.l1.get(), d.l1.get()}}) {
    auto sp = by_name(*pr.first);
    for (auto& p : pr.second->parameters())
      close("GPT params after 3 steps " + p.name, p.tensor, param_slice(sp[p.name].tensor, p.shard_dim));
  }
  say("GPT losses serial/tp: " + losses);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--sp") g_sp = true;
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    if (!v) throw std::runtime_error(std::string("missing env ") + k);
    return std::string(v);
  };
  auto t0 = std::chrono::steady_clock::now();
  try {
    at::set_num_threads(1);
    g_rank = std::stoi(env("RANK"));
    g_t = std::stoi(env("WORLD_SIZE"));
    auto rdv = smp::Rendezvous::connect(env("MASTER_ADDR"), std::stoi(env("MASTER_PORT")), g_rank, g_t,
                                        std::chrono::seconds(60));
    smp::CommOptions opt;
    opt.timeout = std::chrono::seconds(60);
    smp::DeviceMesh mesh(g_t, g_rank, 1, 1, g_t);
    smp::ProcessGroups groups(mesh, rdv, opt);
    g_comm = &groups.get(smp::Axis::TP);
    g_mesh = groups.handle();
    smp::sdk::host_slot() = smp::host_api();
    say(std::string("tp ") + std::to_string(g_t) + (g_sp ? " sequence parallel" : ""));

    check_linear();
    check_embedding_and_ce();
    check_blocks();
    check_tables();
    check_through_abi();
    check_sdk_point_to_point();
    check_layer_traffic();
    check_gpt();
    g_comm->barrier();
  } catch (const std::exception& e) {
    say(std::string("ERROR ") + e.what());
    return 2;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  say(std::to_string(g_checks) + " checks, " + std::to_string(g_failures) + " failures, " + std::to_string(secs) + " s");
  return g_failures ? 1 : 0;
}
