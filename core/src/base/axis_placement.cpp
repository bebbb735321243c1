// AxisPlacement as text: the checkpoint manifest's words for DTensor's
// Replicate(), Shard(d) and Partial().
#include <smp/axis_placement.h>
#include <smp/error.h>

#include <cctype>

namespace smp {

std::string to_string(const AxisPlacement& p) {
  switch (p.kind) {
    case PlacementKind::Shard: return "shard(" + std::to_string(p.dim) + ")";
    case PlacementKind::Partial: return "partial";
    case PlacementKind::Replicate: break;
  }
  return "replicate";
}

AxisPlacement placement_from_string(const std::string& text, const std::string& axis, Role role) {
  AxisPlacement p;
  p.axis = axis;
  p.role = role;
  if (text == "replicate") return p;
  if (text == "partial") {
    p.kind = PlacementKind::Partial;
    return p;
  }
  const std::string open = "shard(";
  if (text.size() > open.size() + 1 && text.compare(0, open.size(), open) == 0 && text.back() == ')' &&
      text.size() - open.size() - 1 <= 4) {
    const std::string digits = text.substr(open.size(), text.size() - open.size() - 1);
    bool ok = true;
    for (char c : digits) ok = ok && std::isdigit(static_cast<unsigned char>(c));
    if (ok) {
      p.kind = PlacementKind::Shard;
      p.dim = std::stoi(digits);
      return p;
    }
  }
  throw Error("placement on axis \"" + axis + "\": \"" + text +
              "\" is not a placement (expected \"replicate\", \"shard(<dim>)\" or \"partial\")");
}

}  // namespace smp
