// The step after the gradients are reduced: the global gradient norm, the
// loss sums over the job, clipping, the fp16 overflow skip, the update and
// the learning-rate schedule.
#pragma once

#include <smp/job_config.h>
#include <smp/mesh.h>

#include "graph/loss_normalizer.h"
#include "optim/lr_schedule.h"

#include <vector>

namespace smp {

class Communicator;
class PhaseClock;
class TrainState;

// The step's loss sums over the job: the last stage's, counted once per tp
// group (every tp rank has the same loss), summed over every rank with
// `extra` values in the same all-reduce (they are summed in place).
LossSums sum_over_world(const LossSums& local, std::vector<double>& extra, const DeviceMesh& mesh, Communicator& world);

struct OptimizerStepResult {
  LossSums loss;  // over the job
  double grad_norm = 0, grad_scale = 1, lr = 0;
  bool skipped = false;
  double clip_seconds = 0, optimizer_seconds = 0;
};

class OptimizerStep {
 public:
  explicit OptimizerStep(const TrainConfig& train);
  // After GradientSync::finish_step; loss_scale is the one the step ran with.
  // metric_sums (optional): summed over the world in the same all-reduce.
  // clock (optional): the step's, whose phase "clip" ends after the norm and
  // "optimizer" after the update (their seconds in the result); null: one of
  // its own for the two.
  OptimizerStepResult run(TrainState& state, const LossSums& local, double loss_scale, const DeviceMesh& mesh,
                          Communicator& world, const c10::Device& device, std::vector<double>* metric_sums = nullptr,
                          PhaseClock* clock = nullptr) const;
  // The program's learning rate for the steps that follow (Runtime::set_learning_rate); < 0: the schedule's.
  void set_lr(double lr) { lr_override_ = lr; }

 private:
  LrSchedule lr_;
  double lr_override_ = -1;
  double clip_;
  // SMP_TEST_FAULT=dp_mean_gradients (tests only): the gradient comes out as a
  // mean over dp instead of the sum, the bug class the equivalence suite must see.
  bool fault_dp_mean_ = false;
  bool fault_small_ = false;  // small_gradient_error: one gradient 1e-3 too large
  bool fault_minor_ = false;  // minor_gradient_error
};

}  // namespace smp
