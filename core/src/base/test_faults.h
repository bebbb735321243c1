// Faults a test injects on purpose, to show that the comparison it makes
// (a layout against the serial run, a resumed run against the whole one)
// sees a small error of that kind. Set per process through the environment:
//
//   SMP_TEST_FAULT=<name>[,<name>...]
//
// Only builds made for testing have them (CMake option SMP_TEST_FAULTS, on
// by default because the suite needs it; a release build turns it off). There
// test_fault() is the constant false, the branches it guards compile away,
// and a process that finds SMP_TEST_FAULT set refuses to start.
//
// In a build with them, each name set is warned about once when a rank joins
// the job; an unknown name is refused, naming the known ones. The checks on
// the hot paths are a load of a bool. Nothing sets the variable except the
// tests that prove the faults are seen (tests/integration/fault_test.cpp).
// In-tree plugins have fault points of their own (plugins/test_faults): their
// names are known here, so that a misspelt one is refused all the same.
#pragma once

#include <smp_test_faults_config.h>

namespace smp {

enum class TestFault {
  DpMeanGradients,            // the gradient a mean over dp instead of the sum
  DroppedMicrobatchGradient,  // microbatch 1's loss sends no gradient back
  ZeroShardOffset,            // ZeRO 1-2 all-gather each rank's shard one element off
  OptimizerStateNotLoaded,    // a checkpoint's optimizer moments left at zero on load
  PipelinePairing,            // pipeline activations received for the neighbouring microbatch
  TpPartialSum,               // a row-parallel layer's partial sums not all-reduced (smp_tp)
  PipelineOneStream,          // pipeline messages of both directions on one group (deadlocks under NCCL's rules)
  Zero3GatherOffset,          // ZeRO-3's gathered parameters read one element off
  ExpertGradWrongGroup,       // an expert's gradient summed over dp instead of its expert-data-parallel group
  TiedMissingSum,             // a tied parameter's gradient not summed over the stages that hold it
  SmallGradientError,         // one parameter's gradient 1e-3 too large (relative), on one rank
  MinorGradientError,         // the gradient of a parameter that moves ~1% of the most, 20% too large
  CpPositionOffset,           // context parallelism: positions of ranks > 0 one off (smp_nn)
  SpGather,                   // sequence parallelism: the all-gathered sequence in the wrong rank order (smp_tp)
};

// Reads SMP_TEST_FAULT: warns about each fault set, refuses an unknown name
// (smp::Error naming the known ones) or, in a build without fault points, any
// setting at all. Called when a rank joins the job.
void check_test_fault_setting();

#if SMP_TEST_FAULTS
// Whether `fault` is set in this process's SMP_TEST_FAULT.
bool test_fault(TestFault fault);
#else
constexpr bool test_fault(TestFault) { return false; }
#endif

}  // namespace smp
