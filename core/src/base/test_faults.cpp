#include "base/test_faults.h"

#include <smp/error.h>
#include <smp/logging.h>

#include <array>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>

namespace smp {

namespace {

#if SMP_TEST_FAULTS
constexpr std::array<std::pair<TestFault, const char*>, 14> kNames = {{
    {TestFault::DpMeanGradients, "dp_mean_gradients"},
    {TestFault::DroppedMicrobatchGradient, "dropped_microbatch_gradient"},
    {TestFault::ZeroShardOffset, "zero_shard_offset"},
    {TestFault::OptimizerStateNotLoaded, "optimizer_state_not_loaded"},
    {TestFault::PipelinePairing, "pipeline_pairing"},
    {TestFault::TpPartialSum, "tp_partial_sum"},
    {TestFault::PipelineOneStream, "pipeline_one_stream"},
    {TestFault::Zero3GatherOffset, "zero3_gather_offset"},
    {TestFault::ExpertGradWrongGroup, "expert_grad_wrong_group"},
    {TestFault::TiedMissingSum, "tied_missing_sum"},
    {TestFault::SmallGradientError, "small_gradient_error"},
    {TestFault::MinorGradientError, "minor_gradient_error"},
    {TestFault::CpPositionOffset, "cp_position_offset"},
    {TestFault::SpGather, "sp_gather"},
}};

// The faults set, one bit each.
unsigned parse(bool warn) {
  const char* env = std::getenv("SMP_TEST_FAULT");
  if (!env || !*env) return 0;
  unsigned set = 0;
  std::stringstream in(env);
  std::string name;
  while (std::getline(in, name, ',')) {
    if (name.empty()) continue;
    bool known = false;
    for (const auto& [fault, n] : kNames)
      if (name == n) {
        set |= 1u << static_cast<unsigned>(fault);
        known = true;
        if (warn) spdlog::warn("SMP_TEST_FAULT={}: a fault is injected on purpose (a test of the tests)", name);
      }
    if (!known) {
      std::string all;
      for (const auto& [fault, n] : kNames) all += (all.empty() ? "" : ", ") + std::string(n);
      throw Error("SMP_TEST_FAULT=" + std::string(env) + ": unknown fault '" + name + "' (known: " + all + ")");
    }
  }
  return set;
}
#endif

}  // namespace

#if SMP_TEST_FAULTS
void check_test_fault_setting() { (void)parse(/*warn=*/true); }

bool test_fault(TestFault fault) {
  static const unsigned set = parse(/*warn=*/false);
  return (set >> static_cast<unsigned>(fault)) & 1u;
}
#else
void check_test_fault_setting() {
  const char* env = std::getenv("SMP_TEST_FAULT");
  if (env && *env)
    throw Error("SMP_TEST_FAULT=" + std::string(env) +
                ": this build has no fault points (configured with -DSMP_TEST_FAULTS=OFF, a release build); "
                "unset SMP_TEST_FAULT, or build with -DSMP_TEST_FAULTS=ON to run the injected-fault tests");
}
#endif

}  // namespace smp
