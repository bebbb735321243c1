// Mesh axis names and comma-separated lists of them, read alike by the config
// (parallel.placement, parallel.axes) and the device mesh. The syntax only:
// which names the core reserves, and what each does, is MeshSpec's
// (builtin_axes in <smp/mesh_spec.h>).
#pragma once

#include <smp/axis_role.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <iterator>
#include <string>
#include <vector>

namespace smp {

inline constexpr std::size_t kMaxAxisName = 15;

// The key that sets an axis' size: parallel.<name> for the core's own axes,
// parallel.axes.<name> for a job's (messages name it).
inline std::string axis_size_key(const std::string& name) {
  return std::string(builtin_axis(name) ? "parallel." : "parallel.axes.") + name;
}

// [a-z][a-z0-9_]*, at most kMaxAxisName characters.
inline bool is_axis_name(const std::string& n) {
  if (n.empty() || n.size() > kMaxAxisName || !std::islower(static_cast<unsigned char>(n[0]))) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_';
  });
}

// "pp, dp,tp" -> {"pp", "dp", "tp"}: split at commas, each part without the
// spaces at its ends (an empty part stays, for the caller to refuse).
inline std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : list + ",") {
    if (c != ',') {
      cur += c;
      continue;
    }
    const auto space = [](char x) { return std::isspace(static_cast<unsigned char>(x)) != 0; };
    const auto first = std::find_if_not(cur.begin(), cur.end(), space);
    const auto last = std::find_if_not(cur.rbegin(), cur.rend(), space).base();
    parts.emplace_back(first < last ? std::string(first, last) : std::string());
    cur.clear();
  }
  return parts;
}

}  // namespace smp
