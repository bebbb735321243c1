// JSON from files smp did not write itself (a checkpoint's manifest, a
// shard's safetensors header), parsed with its nesting bounded: the readers'
// messages dump values, which recurses once per level, and a file of nothing
// but brackets would overflow the stack (fuzz/regressions/manifest).
#pragma once

#include <smp/error.h>

#include <nlohmann/json.hpp>

#include <string>
#include <utility>

namespace smp {

// Deeper than any file smp reads nests (a manifest's job tables included).
inline constexpr int kMaxJsonDepth = 64;

// nlohmann::json::parse, refusing nesting past kMaxJsonDepth with an
// smp::Error "<what>: nested deeper than ...". Syntax errors stay
// nlohmann's exceptions, for the caller to word.
template <class Input>
nlohmann::json parse_json_bounded(Input&& in, const std::string& what) {
  return nlohmann::json::parse(std::forward<Input>(in),
                               [&what](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
                                 if (depth > kMaxJsonDepth)
                                   throw Error(what + ": nested deeper than " + std::to_string(kMaxJsonDepth) +
                                               " levels (not a file smp writes)");
                                 return true;
                               });
}

}  // namespace smp
