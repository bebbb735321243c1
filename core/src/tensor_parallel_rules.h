// Rewrites the model graph for tensor parallelism with the rules plugins registered.
#pragma once

#include <smp/model_graph.h>

namespace smp {

class PluginRegistry;

// Each node whose kind has a rule becomes the rule's distributed kind after the
// rule's check accepts its config for tp_size. A kind without a rule stays
// replicated (logged once per kind). A config the rule rejects is an error
// naming the node and the rule's reason, unless replicate_indivisible is set,
// in which case the node stays replicated with a warning.
void apply_tensor_parallel_rules(ModelGraph& graph, const PluginRegistry& registry, int tp_size,
                                 bool replicate_indivisible);

}  // namespace smp
