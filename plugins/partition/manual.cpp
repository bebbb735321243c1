// "manual": options.manual maps dotted name prefixes to stages.
//   [partition.manual]
//   "embed" = 0
//   "blocks.0" = 0      # matches "blocks.0" and "blocks.0.mlp", not "blocks.01"
//   "blocks" = 1        # everything else under "blocks"
//   "head" = 1
// The longest matching prefix wins. A node no prefix matches, a stage outside
// [0, num_stages), a result with a backward edge, an empty stage or split tied
// nodes (tie_across_stages = false) are errors naming the node / prefix.
#include "partition_algorithms.h"

#include <smp/sdk/host.hpp>

namespace smp::partition {

namespace {
// "blocks.1" matches "blocks.1" and "blocks.1.<anything>", not "blocks.10".
bool matches(const std::string& name, const std::string& prefix) {
  if (name.size() < prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  return name.size() == prefix.size() || name[prefix.size()] == '.';
}
}  // namespace

std::vector<int> manual_partition(const PartitionRequest& r) {
  validate_request(r, "manual");
  expect_options(r, {"manual"}, "manual");
  if (!r.options.is_object() || !r.options.contains("manual"))
    throw sdk::Error("partition strategy 'manual' needs the option 'manual': a table mapping node name "
                     "prefixes to stages, e.g. [partition.manual] \"blocks.0\" = 0");
  const auto& table = r.options.at("manual");
  if (!table.is_object() || table.empty())
    throw sdk::Error("partition option 'manual' must be a non-empty table of \"prefix\" = stage, got " +
                     table.dump());
  std::vector<std::pair<std::string, int>> rules;
  for (auto it = table.begin(); it != table.end(); ++it) {
    const std::string& prefix = it.key();
    const auto& v = it.value();
    if (!v.is_number_integer())
      throw sdk::Error("partition option manual." + prefix + " must be an integer stage, got " + v.dump());
    const long long stage = v.get<long long>();
    if (stage < 0 || stage >= r.num_stages)
      throw sdk::Error("partition option manual." + prefix + " = " + std::to_string(stage) +
                       " is outside the stages [0, " + std::to_string(r.num_stages) + ")");
    if (prefix.empty()) throw sdk::Error("partition option 'manual' has an empty prefix");
    rules.emplace_back(prefix, static_cast<int>(stage));
  }
  std::vector<int> stage(r.graph.nodes.size(), -1);
  for (size_t i = 0; i < r.graph.nodes.size(); ++i) {
    const std::string& name = r.graph.nodes[i].name;
    size_t best_len = 0;
    for (const auto& [prefix, s] : rules) {
      if (matches(name, prefix) && (stage[i] < 0 || prefix.size() > best_len)) {
        stage[i] = s;
        best_len = prefix.size();
      }
    }
    if (stage[i] < 0)
      throw sdk::Error("partition strategy 'manual': node '" + name +
                       "' matches no prefix of the option 'manual'");
  }
  check_partition(r, stage, "manual");
  return stage;
}

}  // namespace smp::partition
