// Serial equivalence: the same job under every parallel layout must give the
// single-process run's losses and final parameters (fp32, stated tolerances).
// Each test runs the serial job once, then its layouts, all through smp-launch.
#include "equivalence.h"
#include "job_runner.h"

#include "corpus.h"  // adapters/encoder: the encoder tests' data, read as their adapters read it
#include "packed_data.h"
#include "pair_data.h"

#include <smp/sdk/sequence.hpp>

#include <boost/filesystem.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>

namespace smp::testing {
namespace {

namespace fs = boost::filesystem;

// The bounds (equivalence.h): pipeline layouts do the same arithmetic in the
// same order; dp and tp change the order of floating-point sums (all-reduce,
// split matmuls), which moves fp32 results by ~1e-6 relative; Adam can
// amplify that where a gradient is ~0, hence the per-parameter update bound is
// looser than the one over all parameters.

struct Layout {
  std::string name;
  int nproc;
  std::vector<std::string> sets;
};

struct Model {
  std::string plugin, config;
};

Model gpt() { return {plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml")}; }
Model towers() { return {plugin_path("towers"), source_path("tests/integration/data/towers-equiv.toml")}; }
Model experts() { return {plugin_path("toy_experts"), source_path("tests/integration/data/experts-equiv.toml")}; }
Model context() { return {plugin_path("toy_context"), source_path("tests/integration/data/context-equiv.toml")}; }
Model ncf() { return {plugin_path("ncf"), source_path("tests/integration/data/ncf-equiv.toml")}; }
Model bert() { return {plugin_path("bert"), source_path("tests/integration/data/bert-equiv.toml")}; }
Model roberta() { return {plugin_path("roberta"), source_path("tests/integration/data/bert-equiv.toml")}; }
Model moe() { return {plugin_path("moe"), source_path("tests/integration/data/moe-equiv.toml")}; }

// serial_sets: the reference run's overrides; every layout gets them too, then its own.
// exempt: a name suffix of parameters left out of the parameter comparison (see Lion's test).
void expect_equivalent(const Model& model, const std::vector<Layout>& layouts,
                       const std::vector<std::string>& serial_sets = {}, const std::string& exempt = "") {
  const Reference ref = run_reference(model.plugin, model.config, serial_sets);
  const JobResult& serial = ref.serial;
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  ASSERT_EQ(ref.noise.exit_code, 0) << ref.noise.output;
  Bounds bounds;
  bounds.exempt = exempt;
  for (const auto& layout : layouts) {
    SCOPED_TRACE("layout " + layout.name);
    std::vector<std::string> sets = serial_sets;
    sets.insert(sets.end(), layout.sets.begin(), layout.sets.end());
    JobResult r = run_job(layout.nproc, model.plugin, model.config, sets);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const Comparison c = compare_with_serial(serial, r, bounds, &ref.noise);
    EXPECT_EQ(c.problems, "") << r.output;
    std::printf("[ layout ] %-28s %zu parameters: update gap %.3g overall, %.3g at most (%s); max |p diff| %.3g; "
                "start gap %.3g; worst noise multiple %.3g\n",
                layout.name.c_str(), c.parameters, c.update_gap, c.worst_param_gap, c.worst_param.c_str(), c.worst_abs,
                c.start_gap, c.worst_noise_multiple);
  }
}

// Every pipeline layout runs under NCCL's point-to-point rules (a send
// completes when its receive runs, a pair's ops in posted order; see
// core/src/comm/rendezvous_p2p.h), so a schedule that would hang on GPUs
// hangs here; the 1F1B "tree" and "manual" ones keep the buffered sends of
// every other test.
const std::string kNcclRules = "comm.p2p_semantics=rendezvous";

std::vector<Layout> pipeline_layouts(int pp, const std::string& manual) {
  const std::string P = "parallel.pp=" + std::to_string(pp), name = "pp" + std::to_string(pp);
  std::vector<Layout> l;
  for (std::string s : {"gpipe", "1f1b", "zb-h1"})
    l.push_back({name + " " + s + " balanced", pp, {P, "parallel.schedule=" + s, kNcclRules}});
  l.push_back({name + " interleaved v2", pp, {P, "parallel.schedule=interleaved-1f1b", "parallel.virtual_stages=2", kNcclRules}});
  // At pp 2: 1 and 2 microbatches (warm-up cut short; 2 is where 1F1B hangs
  // on one stream per pair), 8, and 4 chunks a rank. (Every size up to p 8,
  // m 16, v 4 is replayed in schedule_test; these run through real ranks.)
  if (pp == 2) {
    l.push_back({name + " 1f1b 1 microbatch", pp, {P, "parallel.microbatches=1", kNcclRules}});
    l.push_back({name + " 1f1b 2 microbatches", pp, {P, "parallel.microbatches=2", kNcclRules}});
    l.push_back({name + " zb-h1 8 microbatches", pp, {P, "parallel.schedule=zb-h1", "parallel.microbatches=8", kNcclRules}});
    l.push_back({name + " interleaved v4", pp, {P, "parallel.schedule=interleaved-1f1b", "parallel.virtual_stages=4", kNcclRules}});
  } else {
    l.push_back({name + " 1f1b 2 microbatches", pp, {P, "parallel.microbatches=2", kNcclRules}});
  }
  l.push_back({name + " 1f1b tree", pp, {P, "parallel.partition=tree"}});
  l.push_back({name + " 1f1b manual", pp, {P, "parallel.partition=manual", "partition.manual=" + manual}});
  return l;
}

TEST(GptEquivalence, Pipeline2) {
  expect_equivalent(gpt(), pipeline_layouts(2, R"({ "wte" = 0, "wpe" = 0, "blocks.0" = 0, "blocks.1" = 0, "blocks.2" = 1, "blocks.3" = 1, "ln_f" = 1, "lm_head" = 1, "loss" = 1 })"));
}

TEST(GptEquivalence, Pipeline4) {
  expect_equivalent(gpt(), pipeline_layouts(4, R"({ "wte" = 0, "wpe" = 0, "blocks.0" = 0, "blocks.1" = 1, "blocks.2" = 2, "blocks.3" = 3, "ln_f" = 3, "lm_head" = 3, "loss" = 3 })"));
}

TEST(GptEquivalence, TensorAndDataParallel) {
  expect_equivalent(gpt(), {
                               {"dp2", 2, {"parallel.dp=2"}},
                               {"tp2", 2, {"parallel.tp=2"}},
                               {"tp2 sequence-parallel", 2, {"parallel.tp=2", "tp.sequence_parallel=true"}},
                               {"tp4", 4, {"parallel.tp=4"}},
                               {"pp2 x tp2", 4, {"parallel.pp=2", "parallel.tp=2", kNcclRules}},
                               // The weight pass must not run the input pass's tp collectives again.
                               {"pp2 x tp2 zb-h1 sequence-parallel", 4,
                                {"parallel.pp=2", "parallel.tp=2", "parallel.schedule=zb-h1",
                                 "tp.sequence_parallel=true"}},
                               {"pp2 x dp2 interleaved", 4,
                                {"parallel.pp=2", "parallel.dp=2", "parallel.schedule=interleaved-1f1b",
                                 "parallel.virtual_stages=2", kNcclRules}},
                               {"dp2 x tp2", 4, {"parallel.dp=2", "parallel.tp=2"}},
                               {"pp2 x dp2 x tp2", 8, {"parallel.pp=2", "parallel.dp=2", "parallel.tp=2", kNcclRules}},
                               // Parameters sharded over tp and replicated over dp, and layer norms whose
                               // gradient is partial over tp, all reduced from their placements.
                               {"dp2 x tp2 sequence-parallel", 4,
                                {"parallel.dp=2", "parallel.tp=2", "tp.sequence_parallel=true"}},
                           });
}

// model.arch = "llama": RMSNorm, rotary positions, grouped-query attention
// (2 kv heads: split over tp 2, whole on every rank of tp 4), SwiGLU, no biases,
// an untied head.
TEST(GptEquivalence, LlamaArchUnderPipelineTensorAndDataParallel) {
  expect_equivalent(gpt(),
                    {
                        {"tp2 sequence-parallel", 2, {"parallel.tp=2", "tp.sequence_parallel=true"}},
                        {"tp4 (kv heads replicated)", 4, {"parallel.tp=4"}},
                        {"pp2 x dp2 zero1", 4, {"parallel.pp=2", "parallel.dp=2", "parallel.zero=1"}},
                        {"pp2 x dp2 x tp2", 8, {"parallel.pp=2", "parallel.dp=2", "parallel.tp=2"}},
                    },
                    {"model.arch=llama", "model.kv_heads=2", "model.ffn=48"});
}

// Context parallelism (parallel.cp): every sample's sequence split over the
// cp ranks, chunks r and 2 cp - 1 - r of 2 cp; attention as a ring of K/V
// blocks (or an all-to-all over heads); the loss's sums and the gradients
// summed over cp from the axis' role. Each layout equals the serial run.
std::vector<Layout> context_parallel_layouts() {
  return {
      {"cp2", 2, {"parallel.cp=2"}},
      {"cp4", 4, {"parallel.cp=4"}},
      {"cp2 all-to-all", 2, {"parallel.cp=2", "parallel.cp_mode=\"alltoall\""}},
      {"cp2 x tp2 sequence-parallel", 4, {"parallel.cp=2", "parallel.tp=2", "tp.sequence_parallel=true"}},
      {"cp2 x pp2", 4, {"parallel.cp=2", "parallel.pp=2"}},
      {"cp2 x dp2 zero3", 4, {"parallel.cp=2", "parallel.dp=2", "parallel.zero=3"}},
      // Recomputed layers run their ring again in backward, in step on every cp rank.
      {"cp2 checkpointed layers", 2, {"parallel.cp=2", "memory.checkpoint=[\"transformer_layer\"]"}},
  };
}

TEST(GptEquivalence, ContextParallel) { expect_equivalent(gpt(), context_parallel_layouts()); }

// Llama: rotary positions from each chunk's global offsets, grouped-query
// attention (2 kv heads travel the ring; split over tp 2).
TEST(GptEquivalence, ContextParallelLlama) {
  expect_equivalent(gpt(), context_parallel_layouts(), {"model.arch=llama", "model.kv_heads=2", "model.ffn=48"});
}

// Sequence parallelism is smp_tp's setting, in its own table ([tp], ABI 2.5's
// plugin tables): given there it reaches the tensor-parallel layers, whose tp
// collectives then reduce-scatter and all-gather activations; without it they
// only all-reduce. (That it equals serial is TensorAndDataParallel's.)
TEST(GptEquivalence, SequenceParallelIsSmpTpsTableAndReachesItsLayers) {
  auto tp_ops = [](const std::vector<std::string>& extra) {
    std::vector<std::string> sets = {"train.steps=1", "train.val_batches=0", "parallel.tp=2"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    JobResult r = run_job(2, gpt().plugin, gpt().config, sets);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::set<std::string> ops;
    const auto& tp = r.summary["comm_bytes_analytic_rank0"]["tp"];
    for (auto it = tp.begin(); it != tp.end(); ++it) ops.insert(it.key().substr(0, it.key().find('(')));
    return ops;
  };
  const std::set<std::string> plain = tp_ops({}), sp = tp_ops({"tp.sequence_parallel=true"});
  EXPECT_EQ(plain.count("reduce_scatter"), 0u);
  EXPECT_EQ(sp.count("reduce_scatter"), 1u);
  EXPECT_EQ(sp.count("allgather"), 1u);
}

// Sharded data parallelism (ZeRO 1-3, the memory manager): the same
// arithmetic as plain dp (a reduce-scatter sums like an all-reduce; AdamW is
// elementwise, so updating shards changes nothing), with pipeline stages
// accumulating over 4 microbatches, tensor parallelism, sequence-parallel
// partial gradients, tied embeddings across stages and checkpointing.
TEST(GptEquivalence, ShardedDataParallel) {
  std::vector<Layout> layouts;
  for (int z : {1, 2, 3}) {
    const std::string Z = "parallel.zero=" + std::to_string(z), name = "zero" + std::to_string(z);
    layouts.push_back({name + " dp2", 2, {Z, "parallel.dp=2"}});
    layouts.push_back({name + " dp4", 4, {Z, "parallel.dp=4", "parallel.microbatches=2"}});
    layouts.push_back({name + " pp2 x dp2", 4, {Z, "parallel.pp=2", "parallel.dp=2"}});
  }
  layouts.push_back({"zero3 dp2 x tp2 sequence-parallel", 4,
                     {"parallel.zero=3", "parallel.dp=2", "parallel.tp=2", "tp.sequence_parallel=true"}});
  layouts.push_back({"zero3 pp2 x dp2 interleaved v2", 4,
                     {"memory.shard=parameters", "parallel.pp=2", "parallel.dp=2",
                      "parallel.schedule=interleaved-1f1b", "parallel.virtual_stages=2"}});
  for (int z : {2, 3})
    layouts.push_back({"zero" + std::to_string(z) + " pp2 x dp2 zb-h1", 4,
                       {"parallel.zero=" + std::to_string(z), "parallel.pp=2", "parallel.dp=2",
                        "parallel.schedule=zb-h1"}});
  layouts.push_back({"zero3 dp2 checkpoint blocks", 2,
                     {"parallel.zero=3", "parallel.dp=2", "memory.checkpoint=[\"transformer_layer\"]"}});
  layouts.push_back({"zero1 dp2 no overlap", 2, {"parallel.zero=1", "parallel.dp=2", "train.bucket_mb=0"}});
  expect_equivalent(gpt(), layouts);
}

// Every ZeRO stage on 8 ranks: pp 2 x dp 2 x tp 2.
TEST(GptEquivalence, ShardedDataParallelWithPipelineAndTensorParallel8Ranks) {
  std::vector<Layout> layouts;
  for (int z : {1, 2, 3})
    layouts.push_back({"zero" + std::to_string(z) + " pp2 x dp2 x tp2", 8,
                       {"parallel.zero=" + std::to_string(z), "parallel.pp=2", "parallel.dp=2", "parallel.tp=2"}});
  expect_equivalent(gpt(), layouts);
}

// A masked loss (30% of the targets ignored) gives each microbatch and rank its
// own token count. The reference is one rank with ONE microbatch: the mean over
// every counted token of the batch. A mean of per-microbatch means would differ.
// A vocabulary that tp does not divide (300) is padded as Megatron does, to a
// multiple of 128 x tp: 384 rows serial, 512 under tp 2. The padded logits are
// masked out of the loss, so the losses and the real rows are the serial ones.
TEST(GptEquivalence, PaddedVocabularyUnderTensorParallelism) {
  expect_equivalent(gpt(), {{"tp2", 2, {"parallel.tp=2"}}, {"pp2 x tp2", 4, {"parallel.pp=2", "parallel.tp=2"}}},
                    {"model.vocab=300"});
  // 257 under tp 4: 512 rows, and rank 3's shard [384, 512) is padding only.
  expect_equivalent(gpt(), {{"tp4", 4, {"parallel.tp=4"}}}, {"model.vocab=257"});
  JobResult r = run_job(2, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"),
                        {"model.vocab=300", "parallel.tp=2", "train.steps=1"});
  EXPECT_NE(r.output.find("vocabulary 300 padded to 512"), std::string::npos) << r.output;
}

TEST(GptEquivalence, MaskedLossWithUnevenTokenCounts) {
  expect_equivalent(gpt(),
                    {
                        {"m4 (one rank)", 1, {"parallel.microbatches=4"}},
                        {"pp2 1f1b m4", 2, {"parallel.pp=2", "parallel.microbatches=4"}},
                        {"dp2 m2", 2, {"parallel.dp=2", "parallel.microbatches=2"}},
                        {"pp2 x dp2 m2", 4, {"parallel.pp=2", "parallel.dp=2", "parallel.microbatches=2"}},
                        // Each cp rank holds its chunks' share of the counted tokens, unequal ones:
                        // a loss averaged per rank, not summed with its count, would differ here.
                        {"cp2 ring", 2, {"parallel.cp=2"}},
                        {"cp2 all-to-all", 2, {"parallel.cp=2", "parallel.cp_mode=\"alltoall\""}},
                        {"cp2 x tp2", 4, {"parallel.cp=2", "parallel.tp=2"}},
                        {"cp2 x pp2", 4, {"parallel.cp=2", "parallel.pp=2"}},
                    },
                    {"model.mask_fraction=0.3", "parallel.microbatches=1"});
}

TEST(TowersEquivalence, Pipeline2) {
  expect_equivalent(towers(), pipeline_layouts(2, R"({ "towerA" = 0, "towerB" = 0, "merge" = 1, "head" = 1, "loss" = 1 })"));
}

TEST(TowersEquivalence, Pipeline4) {
  expect_equivalent(towers(), pipeline_layouts(4, R"({ "towerA" = 0, "towerB" = 1, "merge" = 2, "head.fc1" = 2, "head.skip" = 3, "head.act" = 3, "head.out" = 3, "loss" = 3 })"));
}

// NCF: the GMF tower on one pipeline stage and the MLP tower with the head on
// the other (the towers meet only in the head: a DAG cut), row-sharded
// embedding tables under tp, and both together on 4 ranks. The validation
// loss (and with it the ranking the metrics come from) must match too.
TEST(NcfEquivalence, TowersOnStagesShardedTablesAndDataParallel) {
  const std::string towers = R"(partition.manual={ "gmf" = 0, "mlp" = 1, "neumf" = 1, "loss" = 1, "ranking" = 1 })";
  expect_equivalent(ncf(), {{"pp2 towers split", 2, {"parallel.pp=2", "parallel.partition=manual", towers}},
                            {"tp2", 2, {"parallel.tp=2"}},
                            {"dp2", 2, {"parallel.dp=2"}},
                            {"pp2 x tp2", 4, {"parallel.pp=2", "parallel.tp=2", "parallel.partition=manual", towers}}});
}

// BERT and RoBERTa: post-LN bidirectional layers with padding masks, the MLM
// decoder tied to the token embedding across pipeline stages, and (BERT) the
// MLM + NSP loss normalised over the global batch although microbatches and
// ranks hold different numbers of masked tokens. pp and tp keep each
// microbatch's dropout masks (drawn per node, step and microbatch), so they run
// with dropout 0.1; dp gives a rank other microbatches, hence other masks (as in
// Megatron), so the dp layouts compare without dropout.
const std::string kEncoderStages =
    R"(partition.manual={ "embed" = 0, "layers.0" = 0, "layers.1" = 0, "layers.2" = 1, "layers.3" = 1, "mlm" = 1, "nsp" = 1, "loss" = 1 })";

TEST(BertEquivalence, PipelineTensorAndDataParallel) {
  expect_equivalent(bert(), {{"pp2 1f1b", 2, {"parallel.pp=2"}},
                             {"pp2 manual, decoder tied across stages", 2,
                              {"parallel.pp=2", "parallel.partition=manual", kEncoderStages}},
                             {"tp2", 2, {"parallel.tp=2"}},
                             {"pp2 x tp2", 4, {"parallel.pp=2", "parallel.tp=2"}}});
  // "m8 (one rank)": 8 microbatches of 1 sample against the reference's 4 of 2,
  // each with its own number of masked tokens: equal only if the MLM loss is
  // normalised over the whole step, not per microbatch.
  expect_equivalent(bert(), {{"m8 (one rank)", 1, {"parallel.microbatches=8"}},
                             {"dp2", 2, {"parallel.dp=2"}},
                             {"tp2 sequence-parallel", 2, {"parallel.tp=2", "tp.sequence_parallel=true"}},
                             {"pp2 x dp2", 4, {"parallel.pp=2", "parallel.dp=2"}},
                             {"dp2 x tp2 m1", 4, {"parallel.dp=2", "parallel.tp=2", "parallel.microbatches=1"}},
                             {"zero3 pp2 x dp2", 4, {"parallel.zero=3", "parallel.pp=2", "parallel.dp=2"}}},
                    {"model.dropout=0"});
}

// BERT's training data as its adapter reads it (bert-equiv.toml's shape and
// batches, train.seed's and model.mask_prob's defaults): the masked tokens of
// each cp rank's share in every training step, [step][rank].
std::vector<std::vector<int64_t>> bert_masked_per_cp_rank(int cp) {
  const int64_t seq_len = 32, steps = 3, batch = 8;
  encoder::SentenceCorpus corpus("/usr/share/common-licenses", 0.1);
  encoder::PairData pairs(corpus, seq_len, 0.15, 1234);
  std::vector<std::vector<int64_t>> out(steps, std::vector<int64_t>(cp, 0));
  for (int64_t step = 0; step < steps; ++step)
    for (int64_t i = 0; i < batch; ++i) {
      const encoder::PairSample s = pairs.sample(false, step, i);
      for (int r = 0; r < cp; ++r) {
        const at::Tensor pos = smp::sdk::context_parallel_positions(seq_len, cp, r, "parallel.cp");
        for (int64_t j = 0; j < pos.size(0); ++j) out[step][r] += s.targets[pos[j].item<int64_t>()] != -100;
      }
    }
  return out;
}

// BERT under context parallelism (dropout 0: the cp rules refuse it): each
// sample's 32 tokens cut into chunks r and 2 cp - 1 - r of 2 cp, bidirectional
// attention over the ranks (the ring of K/V blocks, or the all-to-all over
// heads) with every rank's share of the padding mask, learned positions at the
// global offsets, [CLS] (next-sentence prediction) on cp rank 0 only. Each
// rank holds its own number of masked tokens (printed and checked here): the
// MLM loss equals serial only because every rank's terms are weighted by the
// step's global count and summed over cp, not averaged per rank. (This data
// fills every sample; RoBERTa's test below has padded ones.)
TEST(BertEquivalence, ContextParallel) {
  for (const int cp : {2, 4}) {
    bool uneven = false;
    const auto masked = bert_masked_per_cp_rank(cp);
    for (size_t step = 0; step < masked.size(); ++step) {
      std::string counts;
      for (int64_t m : masked[step]) counts += (counts.empty() ? "" : " / ") + std::to_string(m);
      std::printf("[ data   ] cp%d step %zu: masked tokens per cp rank %s\n", cp, step + 1, counts.c_str());
      uneven |= *std::min_element(masked[step].begin(), masked[step].end()) !=
                *std::max_element(masked[step].begin(), masked[step].end());
    }
    EXPECT_TRUE(uneven) << "the test needs cp ranks with different numbers of masked tokens";
  }
  expect_equivalent(bert(),
                    {
                        {"cp2 ring", 2, {"parallel.cp=2"}},
                        {"cp2 all-to-all", 2, {"parallel.cp=2", "parallel.cp_mode=\"alltoall\""}},
                        {"cp4 ring", 4, {"parallel.cp=4"}},
                        {"cp2 x tp2", 4, {"parallel.cp=2", "parallel.tp=2"}},
                        {"cp2 x tp2 sequence-parallel", 4,
                         {"parallel.cp=2", "parallel.tp=2", "tp.sequence_parallel=true"}},
                        // The decoder tied to the token embedding across stages; NSP on the last.
                        {"cp2 x pp2 manual", 4,
                         {"parallel.cp=2", "parallel.pp=2", "parallel.partition=manual", kEncoderStages}},
                    },
                    {"model.dropout=0"});
}

// A corpus of 60 short documents (1 to 3 lines of 6 to 20 bytes), written
// once per process: RoBERTa packs whole lines, so its sequences of 32 tokens
// end in padding (the default data's long lines fill every one).
std::string short_document_corpus() {
  static const std::string dir = [] {
    const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "dogs", "run", "far", "blue", "sky", "is", "wide"};
    const std::string d = (fs::temp_directory_path() / fs::unique_path("smp-short-docs-%%%%-%%%%")).string();
    fs::create_directories(d);
    for (int doc = 0; doc < 60; ++doc) {
      std::ofstream out(d + "/doc" + std::to_string(100 + doc) + ".txt");
      for (int line = 0; line < 1 + doc % 3; ++line) {
        std::string text;
        for (int w = 0; text.size() < 6u + static_cast<size_t>((doc * 7 + line * 5) % 15); ++w)
          text += (w ? " " : "") + std::string(words[(doc * 5 + line * 3 + w) % 13]);
        out << text << "\n";
      }
    }
    return d;
  }();
  return dir;
}

TEST(RobertaEquivalence, PipelineTensorAndDataParallel) {
  const std::string stages =
      R"(partition.manual={ "embed" = 0, "layers.0" = 0, "layers.1" = 0, "layers.2" = 1, "layers.3" = 1, "mlm" = 1 })";
  expect_equivalent(roberta(), {{"pp2 manual", 2, {"parallel.pp=2", "parallel.partition=manual", stages}},
                                {"tp2", 2, {"parallel.tp=2"}},
                                {"pp2 x tp2", 4, {"parallel.pp=2", "parallel.tp=2"}}});
  expect_equivalent(roberta(), {{"dp2", 2, {"parallel.dp=2"}},
                                {"tp2 sequence-parallel", 2, {"parallel.tp=2", "tp.sequence_parallel=true"}},
                                {"pp2 x dp2 m1", 4, {"parallel.pp=2", "parallel.dp=2", "parallel.microbatches=1"}}},
                    {"model.dropout=0"});
}

// RoBERTa under cp on short documents: sequences padded at their ends (the
// padding keys each cp rank holds hidden from every other rank's queries), and
// the MLM loss alone, summed with its count (each rank's share of it, uneven).
TEST(RobertaEquivalence, ContextParallelWithPaddedSequences) {
  const std::string data = short_document_corpus();
  {
    encoder::SentenceCorpus corpus(data, 0.1);
    encoder::PackedData packed(corpus, 32, 0.15, 1234);
    std::vector<int64_t> tokens, targets;
    int64_t padded = 0, pads = 0;
    for (int64_t g = 0; g < 3 * 8; ++g) {  // bert-equiv.toml's 3 steps of 8
      packed.sample(false, g, tokens, targets);
      const int64_t n = std::count(tokens.begin(), tokens.end(), packed.vocab().pad());
      padded += n > 0, pads += n;
    }
    std::printf("[ data   ] %lld of 24 training sequences padded, %lld padding tokens of 768\n",
                static_cast<long long>(padded), static_cast<long long>(pads));
    EXPECT_GT(padded, 0) << "the test needs padded sequences";
  }
  expect_equivalent(roberta(),
                    {{"cp2 ring", 2, {"parallel.cp=2"}},
                     {"cp2 all-to-all x tp2", 4, {"parallel.cp=2", "parallel.cp_mode=\"alltoall\"", "parallel.tp=2"}},
                     {"cp2 x pp2", 4, {"parallel.cp=2", "parallel.pp=2"}}},
                    {"model.dropout=0", "model.data=\"" + data + "\""});
}

// Expert parallelism: experts sharded over ep, tokens moved by all-to-all on the
// ep communicator a plugin takes from its module context; expert gradients
// summed over edp (dp 4, ep 2: two replicas of each expert), the router's over dp.
// Optimizers are plugins (ABI 2.3): the standard SGD with Nesterov momentum,
// and a third party's Lion (tests/integration/lion, the SDK alone, loaded
// through plugins.paths), each under every ZeRO stage (which shards its state:
// the optimizer sees 1-D shard segments) and pp x dp, as the serial run.
std::vector<Layout> zero_layouts() {
  std::vector<Layout> layouts;
  for (int z : {0, 1, 2, 3})
    layouts.push_back({"zero" + std::to_string(z) + " dp2", 2, {"parallel.zero=" + std::to_string(z), "parallel.dp=2"}});
  layouts.push_back({"zero3 pp2 x dp2", 4, {"parallel.zero=3", "parallel.pp=2", "parallel.dp=2"}});
  return layouts;
}

// The tutorial's partition strategy (docs/writing-plugins.md, step 6), loaded
// from plugins.paths: a third party's strategy places two stages that train
// equal to serial, and the stages are its split by node count.
TEST(GptEquivalence, TheTutorialsPartitionStrategyOnTwoStages) {
  const std::vector<std::string> sets = {"parallel.pp=2", "parallel.partition=even_count",
                                         "plugins.paths=[\"" + plugin_path("even_count") + "\"]"};
  expect_equivalent(gpt(), {{"pp2 1f1b even_count", 2, sets}});
  JobResult r = run_job(2, gpt().plugin, gpt().config, with(sets, {"train.steps=1", "train.val_batches=0"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(r.summary["stages"].size(), 2u) << r.summary["stages"].dump();
  const auto& stages = r.summary["stages"];
  const size_t first = stages[0]["nodes"].size(), n = first + stages[1]["nodes"].size();
  EXPECT_EQ(first, (n + 1) / 2) << stages.dump();  // node i on stage floor(2 i / n)
}

// Plain SGD (no momentum): the update is the gradient times lr, so parameters
// see its scale too, besides the norms every layout compares.
TEST(GptEquivalence, PlainSgdOverDataTensorAndPipelineParallelism) {
  expect_equivalent(gpt(),
                    {{"dp2", 2, {"parallel.dp=2"}},
                     {"tp2 sequence-parallel", 2, {"parallel.tp=2", "tp.sequence_parallel=true"}},
                     {"pp2 x dp2 zero2", 4, {"parallel.pp=2", "parallel.dp=2", "parallel.zero=2"}}},
                    {"train.optimizer=sgd", "train.lr=0.05", "train.grad_clip=0"});
}

// The same for the layouts where a gradient's scale is easiest to get wrong
// unseen by AdamW: experts over ep (each expert's gradient summed over the
// ranks that routed tokens to it), cp (each rank a share of the tokens) and
// BERT's encoder under pp x tp.
TEST(OptimizerEquivalence, PlainSgdUnderExpertContextAndEncoderLayouts) {
  const std::vector<std::string> sgd = {"train.optimizer=sgd", "train.lr=0.05", "train.grad_clip=0"};
  expect_equivalent(moe(), {{"dp2 ep2", 2, {"parallel.dp=2", "parallel.ep=2"}}}, sgd);
  expect_equivalent(gpt(),
                    {{"cp2 masked", 2, {"parallel.cp=2"}},
                     {"cp2 all-to-all masked", 2, {"parallel.cp=2", "parallel.cp_mode=\"alltoall\""}}},
                    with(sgd, {"model.mask_fraction=0.3", "parallel.microbatches=1"}));
  expect_equivalent(bert(), {{"pp2 x tp2", 4, {"parallel.pp=2", "parallel.tp=2"}}}, sgd);
  expect_equivalent(bert(), {{"cp2 ring", 2, {"parallel.cp=2"}}}, with(sgd, {"model.dropout=0"}));
}

TEST(OptimizerEquivalence, SgdWithNesterovMomentumUnderZero0To3) {
  expect_equivalent(gpt(), zero_layouts(),
                    {"train.optimizer=sgd", "train.lr=0.05", "optimizer.momentum=0.9", "optimizer.nesterov=true"});
}

// The key projection's bias has an exact gradient of zero (softmax does not
// change when a query's scores all shift alike): what backward computes for it
// is fp32 rounding noise, which differs with the reduction order, and Lion's
// sign() turns any noise into a full +-lr step. That parameter alone is left
// out (it changes no output: the losses are compared as tightly as ever).
TEST(OptimizerEquivalence, AThirdPartyLionUnderZero0To3) {
  expect_equivalent(gpt(), zero_layouts(),
                    {"train.optimizer=lion", "train.lr=5e-5", "optimizer.beta2=0.98",
                     "plugins.paths=[\"" + plugin_path("lion") + "\"]"},
                    ".attn.k.bias");
}

// A third party's own expert-parallel layer (tests/integration/experts, the
// SDK alone; the real one is moe, above).
TEST(ExpertsEquivalence, ExpertParallel) {
  expect_equivalent(experts(), {
                                   {"dp2 ep2", 2, {"parallel.dp=2", "parallel.ep=2"}},
                                   // Experts sharded over edp, the router over dp.
                                   {"dp4 ep2 zero3", 4, {"parallel.dp=4", "parallel.ep=2", "parallel.zero=3"}},
                               });
}

// The MoE adapter (adapters/moe) in dropless mode: experts over ep by
// all-to-all, with pp, tp (expert tp on and off, with and without sequence
// parallelism), dp, ZeRO-2 with recomputation and ZeRO-3; losses, gradient
// norms, parameters and every step's expert load, aux and z losses equal the
// serial run's.
TEST(MoeEquivalence, ExpertParallelWithPipelineTensorAndDataParallel) {
  expect_equivalent(moe(), {
                               {"dp2 ep2", 2, {"parallel.dp=2", "parallel.ep=2"}},
                               {"dp4 ep4", 4, {"parallel.dp=4", "parallel.ep=4"}},
                               {"pp2 x dp2 ep2", 4, {"parallel.pp=2", "parallel.dp=2", "parallel.ep=2"}},
                               {"dp2 ep2 x tp2 (expert tp)", 4, {"parallel.dp=2", "parallel.ep=2", "parallel.tp=2"}},
                               {"dp2 ep2 x tp2 (experts whole)", 4,
                                {"parallel.dp=2", "parallel.ep=2", "parallel.tp=2", "model.expert_tp=false"}},
                               {"dp2 ep2 x tp2 sequence-parallel", 4,
                                {"parallel.dp=2", "parallel.ep=2", "parallel.tp=2", "tp.sequence_parallel=true"}},
                               {"dp4 ep2 zero3", 4, {"parallel.dp=4", "parallel.ep=2", "parallel.zero=3"}},
                               // Deferred expert weight gradients with each moe layer recomputed in
                               // backward (a chain per layer) and ZeRO-2's hooks counting them.
                               {"dp2 ep2 zero2 moe recomputed", 2,
                                {"parallel.dp=2", "parallel.ep=2", "parallel.zero=2", "memory.checkpoint=[\"moe\"]"}},
                               {"pp2 x dp2 ep2 x tp2", 8,
                                {"parallel.pp=2", "parallel.dp=2", "parallel.ep=2", "parallel.tp=2"}},
                           });
}

// Capacity dropping (capacity factor 1: a busy expert turns tokens away):
// queues are per sequence, so every layout drops the same (token, expert)
// assignments as the serial run, sequences split over tp included.
TEST(MoeEquivalence, CapacityDropsTheSameTokensInEveryLayout) {
  JobResult serial = run_job(1, moe().plugin, moe().config, {"model.capacity_factor=1.0"});
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  const auto dropped = serial.summary["train_metrics"]["moe_dropped"];
  ASSERT_EQ(dropped.size(), 3u);
  EXPECT_GT(dropped[0].get<double>(), 0.01) << "the test needs tokens dropped";
  expect_equivalent(moe(),
                    {
                        {"dp2 ep2", 2, {"parallel.dp=2", "parallel.ep=2"}},
                        {"dp2 ep2 x tp2 sequence-parallel", 4,
                         {"parallel.dp=2", "parallel.ep=2", "parallel.tp=2", "tp.sequence_parallel=true"}},
                        {"tp2 (experts whole, tokens split)", 2, {"parallel.tp=2", "model.expert_tp=false"}},
                        {"pp2 x ep2 (dp2)", 4, {"parallel.pp=2", "parallel.dp=2", "parallel.ep=2"}},
                    },
                    {"model.capacity_factor=1.0"});
}

// The all-to-all traffic is what the routing asked for: per training step
// each forward dispatch and combine sends the rows routed to other ep ranks
// and backward sends them back (twice the forward rows), plus the counts
// exchange (forward only). The rows come from the layers' own count
// (moe_a2a_bytes, per rank and microbatch); the bytes from the communicator's
// per-rank count and, within Gloo's framing, from the transport's.
TEST(MoeTraffic, AllToAllBytesEqualTheRoutedRows) {
  JobResult r = run_job(2, moe().plugin, moe().config, {"parallel.dp=2", "parallel.ep=2", "train.val_batches=0"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const int ranks = 2, microbatches = 4, layers = 4, local_experts = 2;
  const double counts_bytes = layers * ranks * microbatches * (ranks - 1) * local_experts * 8.0;  // int64 per expert
  double expected = 0;
  for (const auto& m : r.summary["train_metrics"]["moe_a2a_bytes"]) {
    const double forward = m.get<double>() * ranks * microbatches;  // rows and counts, every rank
    expected += 2 * (forward - counts_bytes) + counts_bytes;
  }
  ASSERT_GT(expected, 0);
  double analytic = 0;
  for (const auto& v : r.summary["comm_bytes_analytic_per_rank"]["ep"]["alltoall"]) analytic += v.get<double>();
  EXPECT_EQ(analytic, expected);
  // Rank 0's bytes as its transport counted them: the same plus framing.
  const double rank0 = r.summary["comm_bytes_analytic_per_rank"]["ep"]["alltoall"][0].get<double>();
  double moved = 0;
  for (const auto& [transport, ops] : r.summary["comm_bytes_rank0"]["ep"].items()) moved += ops.value("alltoall", 0.0);
  EXPECT_GE(moved, rank0);
  EXPECT_LE(moved, rank0 * 1.02 + 65536) << "transport count " << moved << ", analytic " << rank0;
}

// A generic named mesh: the job declares an axis the core has never heard of
// (parallel.axes.tok), a third party's plugin (tests/integration/context, the
// SDK alone) brings the "tok" rule and splits each sequence's tokens over it,
// declaring its weights' gradients partial on tok. No core code names "tok":
// the communicator, the rule, the partial-gradient sum, the loss counted
// once per tok group and the global gradient norm all follow from the name.
TEST(ContextEquivalence, AThirdPartyRuleOnAnAxisTheCoreDoesNotKnow) {
  expect_equivalent(context(), {
                                   {"tok2", 2, {"parallel.axes.tok=2"}},
                                   {"tok4", 4, {"parallel.axes.tok=4"}},
                                   {"tok2 x dp2 zero2", 4, {"parallel.axes.tok=2", "parallel.dp=2", "parallel.zero=2"}},
                                   {"pp2 x tok2, tok slowest", 4,
                                    {"parallel.pp=2", "parallel.axes.tok=2", "parallel.placement=\"tok,pp,dp,tp\""}},
                               });
}

}  // namespace
}  // namespace smp::testing
