// A LibTorch program that trains its own torch::nn::Module through smp, as a
// user's program would: the model is built in plain LibTorch (with a
// data-dependent branch inside forward), handed over as a TorchModel, and fed
// batches the program makes itself. Run under smp-launch (one process per
// rank) by program_test.cpp, which compares the layouts' results.
//
//   program_worker --out DIR [--steps N] [--set key=value ...] [--save-at K --save DIR] [--load DIR]
//                  [--bad-inputs] [--seed-per-rank] [--tp-model] [--tied-model] [--set-lr LR]
//                  [--adapter-fed] [--vector-loss] [--norm-model] [--sometimes-model]
//                  [--checkpoint-dir-per-rank BASE] [--plan-lm-sp [--sp-tokens N] [--sp-unsummed]]
//                  [--then-set key=value ...] [--converted-norm]
//                  [--attn-model | --attn-sp-model [--sp-unsummed]] [--attn-heads N]
//
// Writes DIR/rank-<r>.json: losses, gradient norms, the parameters this rank
// holds (gathered under ZeRO-3) and, on every rank, the forward-only scores.
#include <smp/smp.h>
#include <smp/torch.h>
#include <smp/training.h>
#include <smp/sdk/torch_attention.hpp>

#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <optional>
#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kDim = 8, kClasses = 4, kBatch = 8;

// A residual block whose forward branches on each sample's values: a sample
// whose hidden activations are large on average takes a damped path.
struct GatedBlockImpl : torch::nn::Module {
  explicit GatedBlockImpl(int64_t d)
      : fc1(register_module("fc1", torch::nn::Linear(d, 2 * d))), fc2(register_module("fc2", torch::nn::Linear(2 * d, d))) {}
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = torch::relu(fc1->forward(x));
    std::vector<torch::Tensor> rows;
    for (int64_t i = 0; i < h.size(0); ++i) {
      torch::Tensor r = h[i];
      if (r.mean().item<float>() > 0.3f) r = r * 0.5;  // data-dependent control flow
      rows.push_back(r);
    }
    return x + fc2->forward(torch::stack(rows));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(GatedBlock);

// The same shape with the SDK's tensor-parallel layers (whole at tp = 1): the
// branch is on the block's output, which every tp rank holds whole.
struct TpBlockImpl : torch::nn::Module {
  explicit TpBlockImpl(int64_t d)
      : up(register_module("up", smp::sdk::ColumnParallelLinear(d, 2 * d))),
        down(register_module("down", smp::sdk::RowParallelLinear(2 * d, d))) {}
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor y = x + down->forward(torch::relu(up->forward(x)));
    std::vector<torch::Tensor> rows;
    for (int64_t i = 0; i < y.size(0); ++i) rows.push_back(y[i].mean().item<float>() > 0.1f ? y[i] * 0.5 : y[i]);
    return torch::stack(rows);
  }
  smp::sdk::ColumnParallelLinear up;
  smp::sdk::RowParallelLinear down;
};
TORCH_MODULE(TpBlock);

// TpBlock written with unmodified torch::nn::Linear layers, split over tp by
// a plan (parallelize). `tokens` > 1 runs the layers on [B, tokens, d / tokens]
// (LibTorch's matmul path) instead of [B, d] (its addmm path).
// whole_heads: a reshape of up's output by the whole model's count (a bug under tp).
struct PlanBlockImpl : torch::nn::Module {
  PlanBlockImpl(int64_t d, int64_t tokens, bool whole_heads = false)
      : tokens(tokens), whole_heads(whole_heads), up(register_module("up", torch::nn::Linear(d / tokens, 2 * d))),
        down(register_module("down", torch::nn::Linear(2 * d, d / tokens))) {}
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor in = tokens > 1 ? x.view({x.size(0), tokens, -1}) : x;
    torch::Tensor h = up->forward(in);
    if (whole_heads) h = h.view({x.size(0), tokens, 2, x.size(1)}).flatten(2);
    torch::Tensor y = x + down->forward(torch::relu(h)).reshape(x.sizes());
    std::vector<torch::Tensor> rows;
    for (int64_t i = 0; i < y.size(0); ++i) rows.push_back(y[i].mean().item<float>() > 0.1f ? y[i] * 0.5 : y[i]);
    return torch::stack(rows);
  }
  int64_t tokens;
  bool whole_heads;
  torch::nn::Linear up, down;
};
TORCH_MODULE(PlanBlock);

// Tokens from the inputs (their magnitudes), embedded and averaged: the
// table is split by vocabulary rows under a plan.
struct TokenEmbedImpl : torch::nn::Module {
  explicit TokenEmbedImpl(int64_t d) : emb(register_module("emb", torch::nn::Embedding(16, d))) {}
  torch::Tensor forward(torch::Tensor x) { return emb->forward((x.abs() * 4).to(torch::kLong).clamp_max(15)).mean(1); }
  torch::nn::Embedding emb;
};
TORCH_MODULE(TokenEmbed);

// Sequence parallelism by a plan (--plan-lm-sp): tokens embedded without
// pooling, [B, T, d]; each block a LayerNorm on the tokens (SequenceParallel:
// this rank's T / tp of them), a colwise layer whose input is the whole
// sequence (ColwiseFromSequence), a causal mean over the tokens (it needs them
// all), and a rowwise layer whose output is this rank's tokens again
// (RowwiseToSequence). seq_first: the block works on [T, B, d] flattened to
// [T * B, d], Megatron's layout (seq_dim 0, LibTorch's addmm path).
int64_t g_norm_tokens = -1;  // the tokens a batch-first block's norm saw last (a shape check)

struct SeqEmbedImpl : torch::nn::Module {
  SeqEmbedImpl(int64_t d, int64_t tokens) : tokens(tokens), emb(register_module("emb", torch::nn::Embedding(16, d))) {}
  torch::Tensor forward(torch::Tensor x) {
    return emb->forward((x.narrow(1, 0, tokens).abs() * 4).to(torch::kLong).clamp_max(15));
  }
  int64_t tokens;
  torch::nn::Embedding emb;
};
TORCH_MODULE(SeqEmbed);

torch::Tensor causal_mean(const torch::Tensor& h, int64_t dim) {
  std::vector<int64_t> shape(static_cast<size_t>(h.dim()), 1);
  shape[static_cast<size_t>(dim)] = h.size(dim);
  return h.cumsum(dim) / torch::arange(1, h.size(dim) + 1, h.options()).view(shape);
}

struct SpBlockImpl : torch::nn::Module {
  SpBlockImpl(int64_t d, bool seq_first)
      : seq_first(seq_first), norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        up(register_module("up", torch::nn::Linear(d, 2 * d))), down(register_module("down", torch::nn::Linear(2 * d, d))) {}
  torch::Tensor forward(torch::Tensor x) {
    if (!seq_first) {
      g_norm_tokens = x.size(1);
      torch::Tensor h = torch::relu(up->forward(norm->forward(x)));
      return x + down->forward(h + causal_mean(h, 1));
    }
    const torch::Tensor t = x.transpose(0, 1).contiguous();  // [T, B, d]
    const int64_t b = t.size(1);
    torch::Tensor h = torch::relu(up->forward(norm->forward(t.flatten(0, 1))));  // [T * B, 2d]
    h = h.view({-1, b, h.size(1)});
    h = (h + causal_mean(h, 0)).flatten(0, 1);
    return x + down->forward(h).view(t.sizes()).transpose(0, 1);
  }
  bool seq_first;
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
};
TORCH_MODULE(SpBlock);

// The head: a norm on the tokens, then logits per token gathered whole
// (ColwiseGatheredFromSequence), averaged over the tokens.
struct SpHeadImpl : torch::nn::Module {
  SpHeadImpl(int64_t d, int64_t classes)
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})))),
        proj(register_module("proj", torch::nn::Linear(d, classes))) {}
  torch::Tensor forward(torch::Tensor x) { return proj->forward(norm->forward(x)).mean(1); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear proj;
};
TORCH_MODULE(SpHead);

// A tiny decoder written with smp's torch modules (--attn-model): a
// vocabulary-parallel embedding of tokens made from the inputs, [B, T, d];
// blocks of a LayerNorm, ParallelSelfAttention and a residual, then a
// LayerNorm, an MLP of Column/RowParallelLinear and a residual; a head of a
// LayerNorm and a whole Linear on the mean over the tokens. sp
// (--attn-sp-model): the same model under sequence parallelism, the
// activations between the tensor-parallel regions split along the tokens
// (the norms SequenceParallelLayerNorm, unless unsummed: plain LayerNorm, whose
// gradients are then left per rank's tokens, a bug for the test).
std::shared_ptr<torch::nn::LayerNormImpl> token_norm(int64_t d, bool sp, bool unsummed) {
  if (sp && !unsummed) return std::make_shared<smp::sdk::SequenceParallelLayerNormImpl>(std::vector<int64_t>{d});
  return std::make_shared<torch::nn::LayerNormImpl>(std::vector<int64_t>{d});
}

struct AttnEmbedImpl : torch::nn::Module {
  AttnEmbedImpl(int64_t d, bool sp) : emb(register_module("emb", smp::sdk::VocabParallelEmbedding(16, d, sp))) {}
  torch::Tensor forward(torch::Tensor x) { return emb->forward((x.abs() * 4).to(torch::kLong).clamp_max(15)); }
  smp::sdk::VocabParallelEmbedding emb;
};
TORCH_MODULE(AttnEmbed);

struct AttnBlockImpl : torch::nn::Module {
  AttnBlockImpl(int64_t d, int64_t heads, bool sp, bool unsummed)
      : norm1(register_module("norm1", token_norm(d, sp, unsummed))),
        attn(register_module("attn", smp::sdk::ParallelSelfAttention(
                                         smp::sdk::ParallelSelfAttentionOptions(d, heads).sequence_parallel(sp)))),
        norm2(register_module("norm2", token_norm(d, sp, unsummed))),
        up(register_module("up", smp::sdk::ColumnParallelLinear(d, 2 * d, true, false, sp))),
        down(register_module("down", smp::sdk::RowParallelLinear(2 * d, d, true, true, sp))) {}
  torch::Tensor forward(torch::Tensor x) {
    g_norm_tokens = x.size(1);
    x = x + attn->forward(norm1->forward(x));
    return x + down->forward(torch::gelu(up->forward(norm2->forward(x))));
  }
  std::shared_ptr<torch::nn::LayerNormImpl> norm1;
  smp::sdk::ParallelSelfAttention attn;
  std::shared_ptr<torch::nn::LayerNormImpl> norm2;
  smp::sdk::ColumnParallelLinear up;
  smp::sdk::RowParallelLinear down;
};
TORCH_MODULE(AttnBlock);

struct AttnHeadImpl : torch::nn::Module {
  AttnHeadImpl(int64_t d, int64_t classes, bool sp, bool unsummed)
      : sp(sp), norm(register_module("norm", token_norm(d, sp, unsummed))),
        gather(register_module("gather", smp::sdk::GatherFromSequence(1))),
        proj(register_module("proj", torch::nn::Linear(d, classes))) {}
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = norm->forward(x);
    if (sp) h = gather->forward(h);  // every tp rank computes the head whole
    return proj->forward(h.mean(1));
  }
  bool sp;
  std::shared_ptr<torch::nn::LayerNormImpl> norm;
  smp::sdk::GatherFromSequence gather;
  torch::nn::Linear proj;
};
TORCH_MODULE(AttnHead);

// A block with state it updates itself: BatchNorm's running statistics
// (buffers), used in place of the batch's statistics in eval mode. Norm is
// torch::nn::BatchNorm1d, or smp's SyncBatchNorm (the whole batch's
// statistics across dp).
template <class Norm>
struct NormBlockImpl : torch::nn::Module {
  explicit NormBlockImpl(int64_t d)
      : fc(register_module("fc", torch::nn::Linear(d, d))), bn(register_module("bn", Norm(d))) {}
  torch::Tensor forward(torch::Tensor x) { return x + torch::relu(bn->forward(fc->forward(x))); }
  torch::nn::Linear fc;
  Norm bn;
};

// A block with a side layer only some samples take: a microbatch none of whose
// samples takes it leaves the side layer's parameters without a gradient in
// that backward pass, while the block's other parameters get theirs (what a
// skipped branch or an unrouted expert does). Per sample, so every layout
// computes the same function.
struct SometimesBlockImpl : torch::nn::Module {
  explicit SometimesBlockImpl(int64_t d)
      : fc1(register_module("fc1", torch::nn::Linear(d, 2 * d))),
        side(register_module("side", torch::nn::Linear(2 * d, 2 * d))),
        fc2(register_module("fc2", torch::nn::Linear(2 * d, d))) {}
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = torch::relu(fc1->forward(x));
    std::vector<int64_t> taken;
    for (int64_t i = 0; i < x.size(0); ++i)
      if (x[i][0].item<float>() > 0.6f) taken.push_back(i);
    if (!taken.empty()) {
      torch::Tensor idx = torch::tensor(taken, torch::kLong);
      h = h.index_add(0, idx, torch::tanh(side->forward(h.index_select(0, idx))));
    }
    return x + fc2->forward(h);
  }
  torch::nn::Linear fc1, side, fc2;
};
TORCH_MODULE(SometimesBlock);

// The whole model as one module (a Sequential's forward is a template, which AnyModule cannot call).
struct OneNodeImpl : torch::nn::Module {
  explicit OneNodeImpl(torch::nn::Sequential n) : net(register_module("net", std::move(n))) {}
  torch::Tensor forward(torch::Tensor x) { return net->forward(x); }
  torch::nn::Sequential net;
};
TORCH_MODULE(OneNode);

// The global batch of a step, the same on every rank; each dp rank takes its rows.
std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step) {
  auto gen = at::detail::createCPUGenerator(1000 + static_cast<uint64_t>(step));
  torch::Tensor x = at::randn({kBatch, kDim}, gen);
  torch::Tensor y = at::randint(0, kClasses, {kBatch}, gen, at::kLong);
  return {x, y};
}

nlohmann::json values(const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kCPU, torch::kDouble).contiguous().flatten();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"program_worker"};
  std::string out_dir, save_dir, load_dir, per_rank_dir;
  std::vector<std::string> overrides, then_sets, config_kept;
  int steps = 4, save_at = -1;
  double set_lr = -1;
  bool bad_inputs = false, seed_per_rank = false, tp_model = false, tied_model = false, adapter_fed = false,
       through_trainer = false,
       vector_loss = false, norm_model = false, sometimes_model = false, own_forward = false, one_node = false,
       sync_norm = false, plan_model = false, plan_lm = false, plan_whole_heads = false, plan_lm_sp = false,
       sp_unsummed = false, converted_norm = false, attn_model = false, attn_sp_model = false;
  int64_t sp_tokens = kDim, attn_heads = 4;
  app.add_option("--out", out_dir)->required();
  app.add_option("--steps", steps);
  app.add_option("--set", overrides);
  app.add_option("--save-at", save_at);
  app.add_option("--save", save_dir);
  app.add_option("--load", load_dir);
  app.add_flag("--bad-inputs", bad_inputs);
  app.add_option("--set-lr", set_lr, "Runtime::set_learning_rate before the first step");
  app.add_flag("--seed-per-rank", seed_per_rank);
  app.add_flag("--tp-model", tp_model, "blocks of the SDK's column- and row-parallel layers");
  app.add_flag("--tied-model", tied_model, "named nodes, one Linear used at both ends");
  app.add_flag("--adapter-fed", adapter_fed, "the same data through TorchModel::batches and train_step()");
  app.add_flag("--trainer", through_trainer, "step through smp::Trainer (the cadence keys act), then finish()");
  app.add_flag("--vector-loss", vector_loss, "a loss that is not reduced to a scalar");
  app.add_flag("--norm-model", norm_model, "the first block a BatchNorm one (buffers)");
  app.add_flag("--sometimes-model", sometimes_model, "blocks with a layer some microbatches leave without a gradient");
  app.add_flag("--plan-model", plan_model, "blocks of unmodified Linear layers, split over tp by a plan");
  app.add_flag("--plan-lm", plan_lm, "--plan-model with a vocabulary-parallel embedding and a gathered head");
  app.add_flag("--plan-lm-sp", plan_lm_sp,
               "a vocabulary-parallel embedding, LayerNorm blocks and a head under sequence parallelism, by a plan");
  app.add_option("--sp-tokens", sp_tokens, "--plan-lm-sp: the tokens of each sample (8)");
  app.add_flag("--sp-unsummed", sp_unsummed,
               "--plan-lm-sp without planning the norms, --attn-sp-model with plain LayerNorms: their gradients "
               "left per rank's tokens (a bug, for the test)");
  app.add_flag("--attn-model", attn_model,
               "a decoder of smp's torch modules (VocabParallelEmbedding, ParallelSelfAttention, Column/Row linear)");
  app.add_flag("--attn-sp-model", attn_sp_model,
               "--attn-model under sequence parallelism (--sp-unsummed: plain LayerNorms)");
  app.add_option("--attn-heads", attn_heads, "--attn-model's attention heads (4)");
  app.add_flag("--plan-whole-heads", plan_whole_heads, "--plan-model reshaping by the whole head count");
  app.add_flag("--sync-norm", sync_norm, "the first block a SyncBatchNorm one");
  app.add_flag("--converted-norm", converted_norm,
               "--norm-model with its BatchNorm1d made to synchronise over dp by convert_sync_batchnorm");
  app.add_flag("--one-node", one_node, "the whole Sequential handed over as one node");
  app.add_flag("--own-forward", own_forward,
               "keep the model; after training smp::gather_into_modules, then the program's own net->forward");
  app.add_option("--then-set", then_sets,
                 "after training: gather, then a second runtime over the same model with these key=value "
                 "overrides trains `steps` more steps (gathering once midway), and gathers twice");
  app.add_option("--checkpoint-dir-per-rank", per_rank_dir, "run.checkpoint_dir = BASE/rank-<r> (node-local folders)");
  CLI11_PARSE(app, argc, argv);
  const smp::ProcessEnv env = smp::ProcessEnv::from_environment();
  try {
    // The program's own model, built the same way on every rank. It is handed
    // over and dropped once the runtime exists: a rank keeps only the modules
    // of its own stages (counted below through weak pointers).
    std::vector<std::weak_ptr<torch::nn::Module>> children;
    std::unique_ptr<smp::Runtime> rt;
    std::optional<std::pair<torch::nn::Sequential, smp::sdk::TorchModel>> kept;  // --own-forward
    {
      torch::manual_seed(seed_per_rank ? 7 + env.rank : 7);
      torch::nn::Sequential net;
      plan_model = plan_model || plan_lm || plan_whole_heads;
      norm_model = norm_model || converted_norm;
      const bool attn = attn_model || attn_sp_model;
      if (attn) {
        net->push_back(AttnEmbed(kDim, attn_sp_model));
        for (int i = 0; i < 2; ++i) net->push_back(AttnBlock(kDim, attn_heads, attn_sp_model, sp_unsummed));
        net->push_back(AttnHead(kDim, kClasses, attn_sp_model, sp_unsummed));
      } else if (plan_lm)
        net->push_back(TokenEmbed(kDim));
      else if (plan_lm_sp)
        net->push_back(SeqEmbed(kDim, sp_tokens));
      else
        net->push_back(torch::nn::Linear(kDim, kDim));
      for (int i = 0; i < (attn ? 0 : 3); ++i) {
        if (plan_lm_sp)
          net->push_back(SpBlock(kDim, i == 0));
        else if (tp_model)
          net->push_back(TpBlock(kDim));
        else if (plan_model)
          net->push_back(PlanBlock(kDim, i == 0 ? 1 : 2, plan_whole_heads));
        else if (sometimes_model)
          net->push_back(SometimesBlock(kDim));
        else if (norm_model && i == 0)
          net->push_back(std::make_shared<NormBlockImpl<torch::nn::BatchNorm1d>>(kDim));
        else if (sync_norm && i == 0)
          net->push_back(std::make_shared<NormBlockImpl<smp::sdk::SyncBatchNorm>>(kDim));
        else
          net->push_back(GatedBlock(kDim));
      }
      if (plan_lm_sp)
        net->push_back(SpHead(kDim, kClasses));
      else if (!attn)
        net->push_back(torch::nn::Linear(kDim, kClasses));
      for (const auto& c : net->children()) children.push_back(c);
      if (converted_norm && smp::convert_sync_batchnorm(*net) != 1) throw std::runtime_error("one BatchNorm to convert");
      if (plan_model)  // the model's source unchanged: the plan names its layers
        smp::sdk::parallelize(*net, {{"*.up", smp::sdk::TpStyle::Colwise}, {"*.down", smp::sdk::TpStyle::Rowwise}});
      if (plan_lm)
        smp::sdk::parallelize(*net, {{"0.emb", smp::sdk::TpStyle::VocabEmbedding},
                                     {"4", smp::sdk::TpStyle::ColwiseGathered}});
      if (plan_lm_sp) {
        using smp::sdk::TpStyle;
        std::vector<std::pair<std::string, smp::sdk::PlanStyle>> plan = {
            {"0.emb", TpStyle::VocabEmbeddingToSequence},
            {"1.up", {TpStyle::ColwiseFromSequence, 0}},  // [T * B, d]: the sequence is dimension 0
            {"1.down", {TpStyle::RowwiseToSequence, 0}},
            {"2.up", TpStyle::ColwiseFromSequence},  {"3.up", TpStyle::ColwiseFromSequence},
            {"2.down", TpStyle::RowwiseToSequence},  {"3.down", TpStyle::RowwiseToSequence},
            {"4.proj", TpStyle::ColwiseGatheredFromSequence}};
        if (!sp_unsummed) plan.insert(plan.end(), {{"*.norm", TpStyle::SequenceParallel}});
        smp::sdk::parallelize(*net, plan);
      }

      smp::sdk::TorchModel model("gated");
      auto cross_entropy = [](at::Tensor logits, at::Tensor y) { return torch::nn::functional::cross_entropy(logits, y); };
      if (tied_model) {
        // One Linear at both ends of the model (tied weights, on two stages under pp).
        torch::nn::Linear proj(kDim, kDim);
        model.input("x").input("y").node("proj_in", proj, {"x"}, {"h0"});
        for (int i = 1; i <= 3; ++i)
          model.node("block" + std::to_string(i), *(net->begin() + i), {"h" + std::to_string(i - 1)},
                     {"h" + std::to_string(i)});
        model.node("proj_out", proj, {"h3"}, {"h4"}).node("head", *(net->begin() + 4), {"h4"}, {"logits"});
        model.loss("loss", cross_entropy, {"logits", "y"});
      } else if (one_node) {
        model.input("x").input("y").node("net", OneNode(net), {"x"}, {"logits"}).loss("loss", cross_entropy, {"logits", "y"});
      } else if (vector_loss) {  // a loss that forgets to reduce: refused at the first step
        model.input("x").input("y").sequential("net", net, "x", "logits").loss(
            "loss",
            [](at::Tensor logits, at::Tensor y) {
              return torch::nn::functional::cross_entropy(
                  logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
            },
            {"logits", "y"});
      } else {
        model.input("x").input("y").sequential("net", net, "x", "logits").loss("loss", cross_entropy, {"logits", "y"});
      }
      // The same data served through an adapter (smp asks for rows of each global batch).
      if (adapter_fed)
        model.batches([](const smp::sdk::BatchRequest& r) {
          const auto [x, y] = global_batch(r.split == SMP_SPLIT_TRAIN ? r.step : 99);
          return std::vector<at::Tensor>{x.narrow(0, r.first_sample, r.num_samples),
                                         y.narrow(0, r.first_sample, r.num_samples)};
        });
      std::vector<std::string> config = {"train.steps=" + std::to_string(steps), "train.batch_size=8",
                                         "train.optimizer=sgd", "train.lr=0.5", "train.min_lr=0.5",
                                         "train.weight_decay=0", "train.grad_clip=0", "run.log_to_file=false",
                                         "run.timeout_s=120", "run.dir=" + out_dir};
      if (!per_rank_dir.empty()) config.push_back("run.checkpoint_dir=" + per_rank_dir + "/rank-" + std::to_string(env.rank));
      config.insert(config.end(), overrides.begin(), overrides.end());
      const smp::Config cfg = smp::Config::from_string("", "program_worker", config);
      const auto [x0, y0] = global_batch(0);
      rt = smp::Runtime::create(cfg, env, {model.plugin()}, {{"x", x0}, {"y", y0}});
      if (own_forward || !then_sets.empty()) kept.emplace(net, model);
      config_kept = config;
    }
    int alive = 0;
    for (const auto& c : children) alive += c.expired() ? 0 : 1;
    if (set_lr >= 0) rt->set_learning_rate(set_lr);
    const int dp = rt->mesh().size(smp::Axis::DP), dp_rank = rt->mesh().coord(smp::Axis::DP);
    const int64_t rows = kBatch / dp;
    auto share = [&](const torch::Tensor& t) { return t.narrow(0, dp_rank * rows, rows); };

    if (bad_inputs) {
      const auto [x, y] = global_batch(0);
      auto refused = [&](const std::string& what, const smp::Batch& b) {
        try {
          rt->train_step(b);
          std::cout << "accepted: " << what << "\n";
        } catch (const smp::Error& e) {
          std::cout << "refused " << what << ": " << e.what() << "\n";
        }
      };
      refused("missing", {{"x", share(x)}});
      refused("extra", {{"x", share(x)}, {"y", share(y)}, {"z", share(y)}});
      refused("size", {{"x", x.narrow(0, 0, 3)}, {"y", y.narrow(0, 0, 3)}});
      refused("dtype", {{"x", share(x).to(torch::kDouble)}, {"y", share(y)}});
      refused("shape", {{"x", share(x).unsqueeze(1)}, {"y", share(y)}});
      refused("rows", {{"x", share(x)}, {"y", y.narrow(0, 0, 1)}});
      refused("throws", {{"x", share(x)}, {"y", share(y) + 100}});  // class ids out of range: cross_entropy throws
      refused("device", {{"x", share(x).to(at::kMeta)}, {"y", share(y)}});
      try {
        rt->forward({{"x", x.narrow(0, 0, 1)}}, {"logits"});
        std::cout << "accepted: forward rows\n";
      } catch (const smp::Error& e) {
        std::cout << "refused forward rows: " << e.what() << "\n";
      }
      try {
        rt->forward({{"x", share(x)}}, {"loss:loss"});
        std::cout << "accepted: forward without targets\n";
      } catch (const smp::Error& e) {
        std::cout << "refused forward without targets: " << e.what() << "\n";
      }
      try {
        rt->decode({{"x", share(x)}}, {std::vector<int64_t>(static_cast<size_t>(rows), 0), 64}, {"logits"});
        std::cout << "accepted: decode\n";
      } catch (const smp::Error& e) {
        std::cout << "refused decode: " << e.what() << "\n";
      }
      // Still usable: a good step trains.
      const smp::StepResult r = rt->train_step({{"x", share(x)}, {"y", share(y)}});
      std::cout << "after refusals: step " << r.step << " loss " << r.loss << "\n";
      rt->shutdown();
      return 0;
    }

    if (!load_dir.empty()) rt->checkpoints().load(load_dir);
    std::optional<smp::Trainer> trainer;
    if (through_trainer) trainer.emplace(*rt);
    nlohmann::json result;
    result["losses"] = nlohmann::json::array();
    result["grad_norms"] = nlohmann::json::array();
    result["lrs"] = nlohmann::json::array();
    result["alive"] = alive;
    result["resumed_from"] = rt->steps_done();
    for (int64_t s = rt->steps_done(); s < steps; ++s) {
      const auto [x, y] = global_batch(s);
      const smp::Batch batch = {{"x", share(x)}, {"y", share(y)}};
      const smp::StepResult r = trainer ? (adapter_fed ? trainer->step() : trainer->step(batch))
                                        : (adapter_fed ? rt->train_step() : rt->train_step(batch));
      result["losses"].push_back(r.loss);
      result["grad_norms"].push_back(r.grad_norm);
      result["lrs"].push_back(r.lr);
      if (save_at == s + 1) rt->checkpoints().save(save_dir);
    }
    if (trainer) trainer->finish();
    result["eval"] = rt->evaluate({{"x", share(global_batch(99).first)}, {"y", share(global_batch(99).second)}});
    // Forward only, without the targets: the scores of new inputs (this rank's share).
    const smp::Batch scored = rt->forward({{"x", share(global_batch(50).first)}}, {"logits"});
    result["scores"] = values(scored.at("logits"));
    result["dp_rank"] = dp_rank;
    nlohmann::json params = nlohmann::json::object();
    for (const auto& p : rt->gather_parameters())
      params[p.name] = {{"v", values(p.tensor)}, {"shape", p.tensor.sizes().vec()}, {"shard_dim", p.shard_dim}};
    result["params"] = params;
    if (kept) {  // the program's own modules, called by the program: the whole held-out batch on every rank
      smp::gather_into_modules(*rt, kept->second);
      torch::NoGradGuard no_grad;
      kept->first->eval();
      result["own_scores"] = values(kept->first->forward(global_batch(50).first));
    }
    result["tp_rank"] = rt->mesh().coord(smp::Axis::TP);
    result["norm_tokens"] = g_norm_tokens;
    if (!then_sets.empty()) {
      // A second runtime, made after the first is gone, over the same model
      // (its planned layers made whole by the gather above): it trains on from
      // the first one's values, at its own layout.
      rt->shutdown();
      rt.reset();
      std::vector<std::string> again = config_kept;
      again.insert(again.end(), then_sets.begin(), then_sets.end());
      const auto [x0, y0] = global_batch(0);
      rt = smp::Runtime::create(smp::Config::from_string("", "program_worker", again), env, {kept->second.plugin()},
                                {{"x", x0}, {"y", y0}});
      const int dp2 = rt->mesh().size(smp::Axis::DP), dp2_rank = rt->mesh().coord(smp::Axis::DP);
      auto share2 = [&](const torch::Tensor& t) { return t.narrow(0, dp2_rank * (kBatch / dp2), kBatch / dp2); };
      for (int64_t s = steps; s < 2 * steps; ++s) {
        if (s == steps + steps / 2) smp::gather_into_modules(*rt, kept->second);  // midway: whole, then split again
        const auto [x, y] = global_batch(s);
        const smp::StepResult r = rt->train_step({{"x", share2(x)}, {"y", share2(y)}});
        result["losses"].push_back(r.loss);
        result["grad_norms"].push_back(r.grad_norm);
      }
      nlohmann::json params2 = nlohmann::json::object();
      for (const auto& p : rt->gather_parameters())
        params2[p.name] = {{"v", values(p.tensor)}, {"shape", p.tensor.sizes().vec()}, {"shard_dim", p.shard_dim}};
      result["params"] = params2;
      smp::gather_into_modules(*rt, kept->second);
      smp::gather_into_modules(*rt, kept->second);  // twice: the second reads the shards the runtime describes
      torch::NoGradGuard no_grad;
      kept->first->eval();
      result["own_scores"] = values(kept->first->forward(global_batch(50).first));
      result["tp_rank"] = rt->mesh().coord(smp::Axis::TP);
      result["dp_rank"] = dp2_rank;
    }
    std::ofstream(out_dir + "/rank-" + std::to_string(env.rank) + ".json") << result.dump();
    rt->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << env.rank << ": error: " << e.what() << "\n";
    return 1;
  }
}
