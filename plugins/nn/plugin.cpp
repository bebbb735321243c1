// smp_nn.so: the serial module kinds (see include/smp_nn/modules.hpp for configs and methods).
#include <smp_nn/modules.hpp>
#include <smp_nn/moe.hpp>

#include <smp/sdk/plugin.hpp>

using namespace smp_nn;

// Kinds whose parameters come only from InitStream / init_constant can be
// created without storage (ABI 2.2 deferred init; ZeRO-3 fills only the dp shard).
constexpr uint32_t kDeferredInit = SMP_MEMORY_FEATURE_DEFERRED_INIT;

SMP_PLUGIN(smp::sdk::PluginBuilder("smp_nn", "0.1.0")
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
               .module<MoeLoss>("moe_loss"))
