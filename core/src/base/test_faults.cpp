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

constexpr std::array<std::pair<TestFault, const char*>, 7> kNames = {{
    {TestFault::DpMeanGradients, "dp_mean_gradients"},
    {TestFault::DroppedMicrobatchGradient, "dropped_microbatch_gradient"},
    {TestFault::ZeroShardOffset, "zero_shard_offset"},
    {TestFault::OptimizerStateNotLoaded, "optimizer_state_not_loaded"},
    {TestFault::PipelinePairing, "pipeline_pairing"},
    {TestFault::TpPartialSum, "tp_partial_sum"},
    {TestFault::PipelineOneStream, "pipeline_one_stream"},
}};

// The faults set, one bit each.
unsigned parse() {
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
        spdlog::warn("SMP_TEST_FAULT={}: a fault is injected on purpose (a test of the tests)", name);
      }
    if (!known) {
      std::string all;
      for (const auto& [fault, n] : kNames) all += (all.empty() ? "" : ", ") + std::string(n);
      throw Error("SMP_TEST_FAULT=" + std::string(env) + ": unknown fault '" + name + "' (known: " + all + ")");
    }
  }
  return set;
}

}  // namespace

bool test_fault(TestFault fault) {
  static const unsigned set = parse();
  return (set >> static_cast<unsigned>(fault)) & 1u;
}

}  // namespace smp
