// JSON from files smp did not write itself (a checkpoint's manifest, a
// shard's safetensors header), parsed under the one reading discipline
// (smp/sdk/input_file.hpp): nesting bounded, since the readers' messages dump
// values, which recurses once per level, and a file of nothing but brackets
// would overflow the stack (fuzz/regressions/manifest); a key given twice in
// one object refused.
#pragma once

#include <smp/error.h>
#include <smp/common/input_file.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace smp {

inline constexpr int kMaxJsonDepth = input::kMaxJsonDepth;

// input::parse_json with its refusals as smp::Error "<what>: ...".
inline nlohmann::json parse_json_bounded(const std::string& text, const std::string& what) {
  try {
    return input::parse_json(text, what);
  } catch (const input::Error& e) {
    throw Error(e.what());
  }
}

}  // namespace smp
