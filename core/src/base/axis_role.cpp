// The roles' names and the core's own axes (the one reserved list).
#include <smp/axis_role.h>
#include <smp/error.h>

namespace smp {

namespace {

struct RoleName {
  Role role;
  const char* name;
};
constexpr RoleName kRoleNames[] = {{Role::Pipeline, "pipeline"}, {Role::Batch, "batch"},
                                   {Role::Sequence, "sequence"}, {Role::Model, "model"},
                                   {Role::Expert, "expert"},     {Role::ExpertBatch, "expert_batch"},
                                   {Role::Joined, "joined"},     {Role::Replica, "replica"},
                                   {Role::World, "world"}};

}  // namespace

const char* to_string(Role role) {
  for (const auto& r : kRoleNames)
    if (r.role == role) return r.name;
  return "?";
}

Role role_from_string(const std::string& name) {
  std::string known;
  for (const auto& r : kRoleNames) {
    if (name == r.name) return r.role;
    known += std::string(known.empty() ? "" : ", ") + r.name;
  }
  throw Error("mesh: no role named \"" + name + "\" (known: " + known + ")");
}

const std::vector<BuiltinAxis>& builtin_axes() {
  static const std::vector<BuiltinAxis> axes = {
      {"pp", Role::Pipeline, true}, {"dp", Role::Batch, true},          {"tp", Role::Model, true},
      {"cp", Role::Sequence, false}, {"ep", Role::Expert, false},       {"edp", Role::ExpertBatch, false},
      {"mp", Role::Replica, false},  {"world", Role::World, false}};
  return axes;
}

const BuiltinAxis* builtin_axis(const std::string& name) {
  for (const auto& a : builtin_axes())
    if (name == a.name) return &a;
  return nullptr;
}

}  // namespace smp
