// Faults a test injects on purpose, to show that the comparison it makes
// (a layout against the serial run, a resumed run against the whole one)
// sees a small error of that kind. Set per process through the environment:
//
//   SMP_TEST_FAULT=<name>[,<name>...]
//
// Each name set is warned about once; an unknown name is refused, naming the
// known ones. Read once per process: the checks on the hot paths are a load
// of a bool. Nothing sets the variable except the tests that prove the faults
// are seen (tests/integration/fault_test.cpp).
#pragma once

namespace smp {

enum class TestFault {
  DpMeanGradients,            // the gradient a mean over dp instead of the sum
  DroppedMicrobatchGradient,  // microbatch 1's loss sends no gradient back
  ZeroShardOffset,            // ZeRO 1-2 all-gather each rank's shard one element off
  OptimizerStateNotLoaded,    // a checkpoint's optimizer moments left at zero on load
  PipelinePairing,            // pipeline activations received for the neighbouring microbatch
  TpPartialSum,               // a row-parallel layer's partial sums not all-reduced (smp_tp)
  PipelineOneStream,          // pipeline messages of both directions on one group (deadlocks under NCCL's rules)
};

// Whether `fault` is set in this process's SMP_TEST_FAULT. Throws smp::Error
// for a name it does not know (at the first call).
bool test_fault(TestFault fault);

}  // namespace smp
