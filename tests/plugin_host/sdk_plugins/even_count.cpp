// Step 6 of docs/writing-plugins.md (the snippet there is this file, checked
// by Docs.TutorialSnippetsAreBuiltCode): a partition strategy cutting the
// execution order into runs of equal node count.
#include <smp/sdk/plugin.hpp>

std::vector<int> even_count(const smp::sdk::PartitionRequest& r) {
  const int64_t n = static_cast<int64_t>(r.graph.nodes.size());
  if (n < r.num_stages) throw smp::sdk::Error("even_count: fewer nodes than stages");
  std::vector<int> stage(n);
  for (int64_t i = 0; i < n; ++i) stage[i] = static_cast<int>(i * r.num_stages / n);
  return stage;  // ignores shared keys: use it with tie_across_stages = true
}

SMP_PLUGIN(smp::sdk::PluginBuilder("even_count", "0.1.0").partitioner("even_count", &even_count))

