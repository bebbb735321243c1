// smp_nn.so: the serial module kinds (see include/smp_nn/modules.hpp for configs and methods).
#include <smp_nn/cp_rules.hpp>
#include <smp_nn/modules.hpp>
#include <smp_nn/moe.hpp>

#include <smp/sdk/plugin.hpp>

using namespace smp_nn;

// Kinds whose parameters come only from InitStream / init_constant can be
// created without storage (ABI 2.2 deferred init; ZeRO-3 fills only the dp shard).
constexpr uint32_t kDeferredInit = SMP_MEMORY_FEATURE_DEFERRED_INIT;

// The sequence axis (parallel.cp): kinds that compute on a share of every
// sample's sequence (cp_rules.hpp).
SMP_PLUGIN(smp_nn::cp_rules::add(
    smp::sdk::PluginBuilder("smp_nn", "0.1.0")
               .module<Embedding>("embedding", kDeferredInit)
               .module<PositionEmbedding>("position_embedding", kDeferredInit)
               .module<LayerNorm>("layer_norm", kDeferredInit)
               .module<RmsNorm>("rms_norm", kDeferredInit)
               .module<Linear>("linear", kDeferredInit)
               .module<Attention>("attention", kDeferredInit | SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE)
               .module<Mlp>("mlp", kDeferredInit)
               .module<SwigluMlp>("swiglu_mlp", kDeferredInit)
               .module<TransformerLayer>("transformer_layer", kDeferredInit | SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE)
               .module<CrossEntropy>("cross_entropy")
               .module<Add>("add")
               .module<Concat>("concat")
               .module<Relu>("relu")
               .module<Gelu>("gelu")
               .module<Dropout>("dropout")
               .module<MseLoss>("mse_loss")
               .module<EmbeddingTable>("embedding_table", kDeferredInit)
               .module<Mul>("mul")
               .module<BceWithLogits>("bce_with_logits")
               .module<RankingMetrics>("ranking_metrics")
               .module<Select>("select")
               .module<Tanh>("tanh")
               .module<Moe>("moe")
               .module<MoeLoss>("moe_loss")
               // Generation (ABI 2.7): kinds that compute each position alone,
               // and those that keep a KV cache or offset their positions.
               .inference("embedding", SMP_INFERENCE_POSITIONWISE)
               .inference("embedding_table", SMP_INFERENCE_POSITIONWISE)
               .inference("layer_norm", SMP_INFERENCE_POSITIONWISE)
               .inference("rms_norm", SMP_INFERENCE_POSITIONWISE)
               .inference("linear", SMP_INFERENCE_POSITIONWISE)
               .inference("mlp", SMP_INFERENCE_POSITIONWISE)
               .inference("swiglu_mlp", SMP_INFERENCE_POSITIONWISE)
               .inference("add", SMP_INFERENCE_POSITIONWISE)
               .inference("mul", SMP_INFERENCE_POSITIONWISE)
               .inference("relu", SMP_INFERENCE_POSITIONWISE)
               .inference("gelu", SMP_INFERENCE_POSITIONWISE)
               .inference("tanh", SMP_INFERENCE_POSITIONWISE)
               .inference("dropout", SMP_INFERENCE_POSITIONWISE)
               .inference("position_embedding", SMP_INFERENCE_DECODE)
               .inference("attention", SMP_INFERENCE_DECODE)
               .inference("transformer_layer", SMP_INFERENCE_DECODE)
               .inference("moe", SMP_INFERENCE_DECODE),
    {"embedding", "embedding_table", "position_embedding", "layer_norm", "rms_norm", "linear", "mlp", "swiglu_mlp",
     "add", "mul", "relu", "gelu", "tanh", "dropout", "select"},
    {"attention", "transformer_layer"}, {"cross_entropy"}))
