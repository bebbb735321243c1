// Rewrites the model graph for one mesh axis ("tp", "ep") with the rules
// plugins registered for it.
#pragma once

#include <smp/model_graph.h>

#include <string>

namespace smp {

class PluginRegistry;

// Each node whose kind has a rule on `axis` becomes the rule's distributed kind
// after the rule's check accepts its config for axis_size. A kind without a
// rule stays replicated (logged once per kind). A config the rule rejects is an
// error naming the node, the axis and the rule's reason, unless
// replicate_indivisible is set, in which case the node stays replicated with a
// warning. Nodes sharing a key get one decision, so they stay one module.
// Returns how many nodes it split.
//
// On a sequence axis (every_node) each node computes on its share of the
// sequence whatever its kind, so a kind without a rule for the axis (one that
// has not said it can) is an error naming the node, and so is a config its
// rule rejects: nothing stays replicated. `key` is the setting that made the axis.
int apply_parallel_rules(ModelGraph& graph, const PluginRegistry& registry, const std::string& axis, int axis_size,
                         bool replicate_indivisible, bool every_node = false, const std::string& key = "");

}  // namespace smp
