// smp_nn.so: the serial module kinds (see include/smp_nn/modules.hpp for configs and methods).
#include <smp_nn/modules.hpp>

#include <smp/sdk/plugin.hpp>

using namespace smp_nn;

SMP_PLUGIN(smp::sdk::PluginBuilder("smp_nn", "0.1.0")
               .module<Embedding>("embedding")
               .module<PositionEmbedding>("position_embedding")
               .module<LayerNorm>("layer_norm")
               .module<Linear>("linear")
               .module<Attention>("attention", SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE)
               .module<Mlp>("mlp")
               .module<TransformerLayer>("transformer_layer", SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE)
               .module<CrossEntropy>("cross_entropy")
               .module<Add>("add")
               .module<Concat>("concat")
               .module<Relu>("relu")
               .module<Gelu>("gelu")
               .module<Dropout>("dropout")
               .module<MseLoss>("mse_loss")
               .module<EmbeddingTable>("embedding_table"))
