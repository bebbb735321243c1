// smp_tp.so: Megatron-style tensor-parallel kinds and the rules that map the smp_nn
// kinds onto them (see include/smp_tp/modules.hpp). Uses only the SDK.
#include <smp_tp/modules.hpp>
#include <smp_tp/rules.hpp>

#include <smp/sdk/plugin.hpp>

using namespace smp_tp;

SMP_PLUGIN(smp::sdk::PluginBuilder("smp_tp", "0.1.0")
               .module<TpLinear>("tp_linear")
               .module<ColumnParallelLinear>("column_parallel_linear")
               .module<RowParallelLinear>("row_parallel_linear")
               .module<VocabParallelEmbedding>("vocab_parallel_embedding")
               .module<VocabParallelCrossEntropy>("vocab_parallel_cross_entropy")
               .module<ParallelAttention>("parallel_attention")
               .module<ParallelMlp>("parallel_mlp")
               .module<ParallelTransformerLayer>("parallel_transformer_layer")
               .module<DistPositionEmbedding>("dist_position_embedding")
               .module<DistLayerNorm>("dist_layer_norm")
               .module<DistDropout>("dist_dropout")
               .module<ShardedEmbeddingTable>("sharded_embedding_table")
               .tp_rule("linear", "tp_linear", &rules::linear)
               .tp_rule("embedding", "vocab_parallel_embedding", &rules::embedding)
               .tp_rule("cross_entropy", "vocab_parallel_cross_entropy", &rules::cross_entropy)
               .tp_rule("attention", "parallel_attention", &rules::attention)
               .tp_rule("mlp", "parallel_mlp", &rules::mlp)
               .tp_rule("transformer_layer", "parallel_transformer_layer", &rules::transformer_layer)
               .tp_rule("position_embedding", "dist_position_embedding")
               .tp_rule("layer_norm", "dist_layer_norm")
               .tp_rule("dropout", "dist_dropout")
               .tp_rule("embedding_table", "sharded_embedding_table", &rules::embedding_table))
