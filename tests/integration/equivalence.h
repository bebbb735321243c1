// A layout's run against the serial run of the same job: what the
// equivalence tests assert is empty, and what the injected-fault tests
// (fault_test.cpp) assert is not.
#pragma once

#include "job_runner.h"

#include <string>
#include <vector>

namespace smp::testing {

struct Bounds {
  // Per step: the loss (and the validation loss) and the global gradient norm
  // before clipping, relative to the serial run's. AdamW's update ignores a
  // uniform scale on a gradient, the norm does not.
  double loss_rtol = 2e-5;
  double norm_rtol = 1e-5;
  // What training changed, u = p - p0 (each run's own initial parameters,
  // run.dump_parameters), against the serial run's u_ref, over all parameters
  // together: |u - u_ref| / |u_ref| (Euclidean norms). Measured over the 115
  // layouts of equivalence_test: at most 6.3e-5 (GPT, tp 2), 8.4e-7 for pipelines.
  double update_rtol = 2e-4;
  // And per parameter, in the largest element: max|u - u_ref| over the larger
  // of max|u_ref| and a tenth of the largest update of any parameter (a
  // parameter whose exact gradient is zero, such as attention's key bias, is
  // moved by rounding noise alone, which differs between layouts; against its
  // own tiny update that noise would look like any size of error). Measured: at
  // most 1.2e-2 (GPT, tp 2, an MLP projection).
  double param_update_rtol = 3e-2;
  // Where the runs end, element by element: max|p - p_ref| over every
  // parameter. Measured over the 144 layouts of equivalence_test: at most
  // 2.1e-5 (pp 2 and 4 with 2 microbatches against the serial run's 4), 1.5e-5
  // for tp and cp.
  double param_abs_tol = 1e-4;
  // Where the runs start: max|p0 - p0_ref| over max|p0_ref|, per parameter.
  // Every layout initialises from the same seed, so it starts where the serial
  // run does; a layout initialising a shard from another stream of the
  // generator would train a different model as well as the serial run does.
  double start_rtol = 1e-7;
  // A name suffix of parameters left out of the parameter comparison (see Lion's test).
  std::string exempt;
};

struct Comparison {
  std::string problems;  // empty: the runs agree within the bounds
  size_t parameters = 0;        // compared
  double update_gap = 0;        // |u - u_ref| / |u_ref| over all of them
  double worst_param_gap = 0;   // the largest per-parameter max|u - u_ref| / max|u_ref|
  std::string worst_param;
  double worst_abs = 0;         // max|p - p_ref|
  double start_gap = 0;         // the largest per-parameter max|p0 - p0_ref| / max|p0_ref|
};

// Both runs must have written parameters-initial/ and parameters/ (run.dump_parameters).
// Checks: the same number of steps, losses, gradient norms, validation loss
// and graph metrics within the bounds; the serial run's parameter list not
// empty and moved; every serial parameter present in the layout's run, of the
// same shape (a vocabulary padded for a larger tp: only the rows the serial
// run has, and only for the vocabulary's parameters, wte.* and lm_head.*);
// data-parallel replicas equal; the updates within the bounds.
Comparison compare_with_serial(const JobResult& serial, const JobResult& layout, const Bounds& bounds = {});

// The same for the per-step gradient norms alone.
std::string grad_norm_problems(const JobResult& serial, const JobResult& layout, double norm_rtol = Bounds{}.norm_rtol);

}  // namespace smp::testing
