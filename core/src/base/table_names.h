// The configuration's table names: the core's own, and what a plugin's table
// (SMP_EXTENSION_CONFIG) may be called. Read alike by the config and the
// plugin registry.
#pragma once

#include <algorithm>
#include <cctype>
#include <iterator>
#include <string>
#include <vector>

namespace smp {

// Tables whose keys the core checks, then those it hands to one owner as written.
inline constexpr const char* kSchemaTables[] = {"parallel", "memory", "train", "run", "comm", "plugins"};
// [elastic] is smp-launch's (its layouts by world size, planned_layout.h); the worker leaves it alone.
inline constexpr const char* kFreeTables[] = {"model", "partition", "optimizer", "elastic"};

inline bool is_schema_table(const std::string& t) {
  return std::find(std::begin(kSchemaTables), std::end(kSchemaTables), t) != std::end(kSchemaTables);
}
inline bool is_free_table(const std::string& t) {
  return std::find(std::begin(kFreeTables), std::end(kFreeTables), t) != std::end(kFreeTables);
}
inline bool is_core_table(const std::string& t) { return is_schema_table(t) || is_free_table(t); }

// "[parallel], [memory], ..., [optimizer]": every core table, for messages.
inline std::string core_tables_text() {
  std::string out;
  auto add = [&out](const char* t) { out += (out.empty() ? "[" : ", [") + std::string(t) + "]"; };
  for (const char* t : kSchemaTables) add(t);
  for (const char* t : kFreeTables) add(t);
  return out;
}

// [a-z][a-z0-9_]*, and not one of the core's tables.
inline bool is_plugin_table_name(const std::string& t) {
  if (t.empty() || !std::islower(static_cast<unsigned char>(t[0])) || is_core_table(t)) return false;
  return std::all_of(t.begin(), t.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_';
  });
}

// Levenshtein distance, for "did you mean".
inline std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The candidate nearest to `name` within two edits, or "".
inline std::string nearest_name(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = 3;
  for (const auto& c : candidates) {
    const std::size_t d = edit_distance(name, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

}  // namespace smp
