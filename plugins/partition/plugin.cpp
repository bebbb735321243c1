// The smp_partition plugin: pipeline partition strategies "tree", "balanced", "manual".
#include "partition_algorithms.h"

#include <smp/sdk/plugin.hpp>

#include <utility>

// partitioner() returns PluginBuilder&; the builder is move-only, hence std::move.
SMP_PLUGIN(std::move(smp::sdk::PluginBuilder("smp_partition", "0.1.0")
                         .partitioner("tree", &smp::partition::tree_partition)
                         .partitioner("balanced", &smp::partition::balanced_partition)
                         .partitioner("manual", &smp::partition::manual_partition)))
