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
  // And per parameter, in the largest element: max|u - u_ref| within
  //   param_update_rtol x max|u_ref|           (the parameter's own update)
  //   + noise_factor x max|u_noise - u_ref|    (its measured noise)
  //   + rounding_ulps x 2^-23 x the largest update of any parameter.
  // The noise is how far a second serial run that sums the same gradients in
  // another order (another microbatch count, run_reference) moved it. A
  // parameter whose exact gradient is ~0, such as attention's key bias, is
  // moved by rounding alone, which AdamW amplifies to steps of lr: the noise
  // run shows it, and a parameter with a real gradient keeps a bound relative
  // to its own update. The last term: differences below fp32 rounding of the
  // model's updates (SGD's key biases move by ~1e-13) are not told apart.
  // Measured over the 27 equivalence tests (158 layouts, 8,724 parameters;
  // SMP_EQUIVALENCE_LOG=<file> writes them): with rtol 1e-3 the largest
  // noise multiple needed is 7.1 (BERT, a key bias under AdamW); a tighter
  // rtol runs into tensor parallelism's own reordering, which the noise run
  // does not make (BERT tp 2: an MLP weight 1.2e-6 off of 2.0e-3, 6e-4 of it,
  // 10.3 x its noise above 3e-4). A gradient 1e-3 off on one parameter
  // (fault_test) is caught over all parameters and by the norms.
  double param_update_rtol = 1e-3;
  double noise_factor = 15;
  double rounding_ulps = 16;
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
  double worst_noise_multiple = 0;  // the largest per-parameter noise_factor this layout needed
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
// `noise`: run_reference's second serial run, for the per-parameter noise
// (without one, the noise counts as zero: the bound is relative alone).
Comparison compare_with_serial(const JobResult& serial, const JobResult& layout, const Bounds& bounds = {},
                               const JobResult* noise = nullptr);

// The serial run of a job, and its noise run: the same job with another
// microbatch count (1, or 2 where the job sets 1), whose sums of microbatch
// gradients differ from the serial run's only in rounding.
struct Reference {
  JobResult serial, noise;
};
Reference run_reference(const std::string& plugin, const std::string& config, const std::vector<std::string>& sets);

// The same for the per-step gradient norms alone.
std::string grad_norm_problems(const JobResult& serial, const JobResult& layout, double norm_rtol = Bounds{}.norm_rtol);

}  // namespace smp::testing
