// smp_tp.so: Megatron-style tensor-parallel kinds and the rules that map the smp_nn
// kinds onto them (see include/smp_tp/modules.hpp). Uses only the SDK.
#include <smp_tp/modules.hpp>
#include <smp_tp/moe.hpp>
#include <smp_tp/rules.hpp>
#include <smp_nn/cp_rules.hpp>

#include <smp/sdk/plugin.hpp>

using namespace smp_tp;

// Kinds whose parameters come only from InitStream / init_constant can be
// created without storage (ABI 2.2 deferred init; ZeRO-3 fills only the dp shard).
constexpr uint32_t kDeferredInit = SMP_MEMORY_FEATURE_DEFERRED_INIT;

// The sequence axis (parallel.cp) after tp: the tensor-parallel kinds compute
// on a share of every sample's sequence too (smp_nn's cp_rules.hpp).
SMP_PLUGIN(smp_nn::cp_rules::add(
    smp::sdk::PluginBuilder("smp_tp", "0.1.0")
               .config_table("tp", &rules::table)
               .module<TpLinear>("tp_linear", kDeferredInit)
               .module<ColumnParallelLinear>("column_parallel_linear", kDeferredInit)
               .module<RowParallelLinear>("row_parallel_linear", kDeferredInit)
               .module<VocabParallelEmbedding>("vocab_parallel_embedding", kDeferredInit)
               .module<VocabParallelCrossEntropy>("vocab_parallel_cross_entropy")
               .module<ParallelAttention>("parallel_attention", kDeferredInit | SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE)
               .module<ParallelMlp>("parallel_mlp", kDeferredInit)
               .module<ParallelSwigluMlp>("parallel_swiglu_mlp", kDeferredInit)
               .module<ParallelTransformerLayer>("parallel_transformer_layer", kDeferredInit | SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE)
               .module<DistPositionEmbedding>("dist_position_embedding", kDeferredInit)
               .module<DistLayerNorm>("dist_layer_norm", kDeferredInit)
               .module<DistRmsNorm>("dist_rms_norm", kDeferredInit)
               .module<DistDropout>("dist_dropout")
               .module<ShardedEmbeddingTable>("sharded_embedding_table", kDeferredInit)
               .module<DistSelect>("dist_select")
               .module<ParallelMoe>("parallel_moe")
               // The last two numbers: the fractions of parameter and activation bytes split
               // over tp, for the memory model. Megatron's layers keep the layer norms and the
               // inputs of their column-parallel GEMMs whole (without sequence parallelism):
               // a measured share of a transformer layer's activations (docs/memory.md); the
               // vocabulary-parallel logits and loss split entirely; norms, dropout and
               // position embeddings stay replicated.
               .tp_rule("linear", "tp_linear", &rules::linear, 1.0, 0.5)
               .tp_rule("embedding", "vocab_parallel_embedding", &rules::embedding, 1.0, 1.0)
               .tp_rule("cross_entropy", "vocab_parallel_cross_entropy", nullptr, 1.0, 1.0)
               .tp_rule("attention", "parallel_attention", &rules::attention, 1.0, 0.7)
               .tp_rule("mlp", "parallel_mlp", &rules::mlp, 1.0, 0.7)
               .tp_rule("swiglu_mlp", "parallel_swiglu_mlp", &rules::swiglu_mlp, 1.0, 0.7)
               .tp_rule("transformer_layer", "parallel_transformer_layer", &rules::transformer_layer, 1.0, 0.7)
               .tp_rule("position_embedding", "dist_position_embedding", nullptr, 0.0, 0.0)
               .tp_rule("layer_norm", "dist_layer_norm", nullptr, 0.0, 0.0)
               .tp_rule("rms_norm", "dist_rms_norm", nullptr, 0.0, 0.0)
               .tp_rule("dropout", "dist_dropout", nullptr, 0.0, 0.0)
               .tp_rule("embedding_table", "sharded_embedding_table", &rules::embedding_table, 1.0, 1.0)
               .tp_rule("select", "dist_select", nullptr, 0.0, 0.0)
               // moe: the experts split over ep (the router is a rounding error),
               // not the activations: ep splits dp, whose share of the batch the
               // estimate already takes. Over tp the experts' ffn (expert_tp): of a
               // token's kept values the ffn-wide ones, not the rows moved (the
               // moe adapter's hint: about 0.4 of them).
               .tp_rule("moe", "parallel_moe", &rules::moe_tp, 1.0, 0.4)
               .rule("ep", "moe", "parallel_moe", &rules::moe_ep, 1.0, 0.0)
               .rule("ep", "parallel_moe", "parallel_moe", &rules::moe_ep, 1.0, 0.0)
               // Generation (ABI 2.7). Under sequence parallelism the kinds that
               // split the sequence refuse a decoding call by name.
               .inference("tp_linear", SMP_INFERENCE_POSITIONWISE)
               .inference("column_parallel_linear", SMP_INFERENCE_POSITIONWISE)
               .inference("row_parallel_linear", SMP_INFERENCE_POSITIONWISE)
               .inference("vocab_parallel_embedding", SMP_INFERENCE_POSITIONWISE)
               .sharded_output("vocab_parallel_embedding", "attend", 0, "tp", -1)  // the logits, vocabulary-sharded
               .inference("sharded_embedding_table", SMP_INFERENCE_POSITIONWISE)
               .inference("parallel_mlp", SMP_INFERENCE_POSITIONWISE)
               .inference("parallel_swiglu_mlp", SMP_INFERENCE_POSITIONWISE)
               .inference("dist_layer_norm", SMP_INFERENCE_POSITIONWISE)
               .inference("dist_rms_norm", SMP_INFERENCE_POSITIONWISE)
               .inference("dist_dropout", SMP_INFERENCE_POSITIONWISE)
               .inference("dist_position_embedding", SMP_INFERENCE_DECODE)
               .inference("parallel_attention", SMP_INFERENCE_DECODE)
               .inference("parallel_transformer_layer", SMP_INFERENCE_DECODE)
               .inference("parallel_moe", SMP_INFERENCE_DECODE),
    {"tp_linear", "column_parallel_linear", "row_parallel_linear", "vocab_parallel_embedding", "parallel_mlp",
     "parallel_swiglu_mlp", "dist_layer_norm", "dist_rms_norm", "dist_dropout", "dist_position_embedding",
     "sharded_embedding_table", "dist_select"},
    {"parallel_attention", "parallel_transformer_layer"}, {"vocab_parallel_cross_entropy"}))
