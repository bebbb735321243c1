// The nearest known name to a mistyped one, for refusals of unknown keys.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

namespace smp::sdk {

// "; did you mean '<k>'?" for the known key nearest to `key` (at most two
// edits away, as the core's config does), else "".
inline std::string did_you_mean(const std::string& key, std::initializer_list<const char*> known) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
        diagonal = up;
      }
    }
    return row[b.size()];
  };
  const char* best = nullptr;
  size_t best_d = 3;
  for (const char* k : known)
    if (const size_t d = distance(key, k); d < best_d) best_d = d, best = k;
  return best ? std::string("; did you mean '") + best + "'?" : std::string();
}

}  // namespace smp::sdk
