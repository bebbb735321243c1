// Value types of the train state and of a step, apart from the runtime that
// produces them: what checkpoints read and write (StateEntry), what a step
// reports (StepResult, StepPhases, MemoryAccount) and a parameter as a rank
// holds it (ParameterView). Parts that only move values (checkpoint I/O, the
// training loop's records) include this, not the composition root (runtime.h).
#pragma once

#include <smp/axis_placement.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

struct ParameterView {
  std::string name;  // "<module key>.<local name>", e.g. "blocks.0.attn.q_weight"
  at::Tensor tensor; // this rank's shard
  // Shorthands kept for programs written before placements: the shard
  // dimension on the built-in model axis (tp) and on the expert axis, -1 when
  // not sharded there. (Before placements, so that ParameterView{name, t, 0, -1}
  // still means what it did.)
  int shard_dim = -1;
  int ep_shard_dim = -1;
  // Its placement on each axis it may differ on (the mesh's model, sequence
  // and batch dimensions and the expert axis), in the mesh's order.
  std::vector<AxisPlacement> placements;

  // The placement on `axis` (Replicate when not listed).
  AxisPlacement placement(const std::string& axis) const {
    for (const auto& p : placements)
      if (p.axis == axis) return p;
    AxisPlacement r;
    r.axis = axis;
    return r;
  }
};

// Seconds per phase of a step. compute = the schedule's forwards/backwards,
// including the waits for pipeline peers and the dp buckets launched during
// backward; grad_sync = what is left of the gradient reductions after the
// last backward; snapshot = waiting for a background checkpoint's copies
// (run.checkpoint_async) before the update may change the state; clip =
// global norm + clipping + the loss/norm all-reduce; optimizer = the
// parameter update.
struct PhaseSeconds {
  double compute = 0, grad_sync = 0, clip = 0, optimizer = 0, snapshot = 0;
};

// Where a step's wall time went on this rank, on the host's clock (when the
// host got past each phase's end), and on a CUDA device the same phases on
// the device's clock (`device`: CUDA events on the compute stream at each
// boundary, how long the stream took between them; on a GPU the host runs
// ahead of its kernels and a `.item()` waits for all of them, so a host phase
// may hold another's GPU time). On the CPU `device` is empty: no device clock.
struct StepPhases : PhaseSeconds {
  std::optional<PhaseSeconds> device;
};

// One slice of what a rank holds between steps (Checkpointer::entries): a
// tensor of the train state as this rank holds it, and where it sits in the
// global tensor that all ranks' slices make up. The block of this rank starts
// at `offsets` of the global tensor and has block_shape (tp/ep shards: the
// global tensor is the shards put together along their shard dimension, in
// rank order). Under ZeRO a rank holds a flat range of its block instead:
// elements [flat_begin, flat_begin + local.numel()) of the block in row-major
// order; flat_begin = -1 means the whole block. Counters (steps, the loss
// scale) are 0-d entries with empty shapes.
//
// Names: "model/<parameter>", "optim/master/<parameter>" (16-bit compute),
// "optim/<state>/<parameter>" (the optimizer's, e.g. "exp_avg"),
// "optim/step", "train/step", "loss_scaler/{scale,good_steps,skipped}" (fp16).
// The learning rate, the data position (adapters are asked for a batch by
// step) and the random streams (counter-based, from train.seed and the step)
// follow from train/step and the config.
struct StateEntry {
  std::string name;
  std::vector<int64_t> global_shape, offsets, block_shape;
  int64_t flat_begin = -1;
  at::Tensor local;    // the live tensor (a view, not a copy); counters: a 0-d copy
  bool owner = false;  // exactly one of the ranks holding these values owns them (writes them once)
  // A parameter's and its optimizer state's placement on each axis of more
  // than one rank it may be placed on (the manifest records them); empty for
  // counters. offsets and block_shape follow from these and the coordinates.
  std::vector<AxisPlacement> placements;
};

// This rank's memory by category (bytes), as the memory manager accounts it:
// what it holds between steps, and the peak of what a step allocates on top
// (activations, gathered ZeRO-3 parameters, communication buffers).
struct MemoryAccount {
  int64_t parameters = 0;       // in the compute dtype: whole, or this rank's shards (+ gathered units)
  int64_t gradients = 0;        // gradient buckets and shards
  int64_t optimizer_state = 0;  // AdamW moments and fp32 master weights
  int64_t step_peak = 0;        // peak bytes allocated during the step's forwards/backwards
  int64_t offloaded = 0;        // memory.offload: most host bytes holding activations at once (not in total)
  // Parts of step_peak (not added to the total again): activations by schedule
  // slot (the most held at once by slots in flight, and the largest slot), and
  // the most bytes pipeline sends in flight held (communication buffers).
  int64_t activations = 0, largest_slot = 0, send_buffers = 0;
  int64_t total() const { return parameters + gradients + optimizer_state + step_peak; }
  // Each category the larger of this and o (the largest over a run's steps).
  void keep_largest(const MemoryAccount& o) {
    for (auto field : {&MemoryAccount::parameters, &MemoryAccount::gradients, &MemoryAccount::optimizer_state,
                       &MemoryAccount::step_peak, &MemoryAccount::offloaded, &MemoryAccount::activations,
                       &MemoryAccount::largest_slot, &MemoryAccount::send_buffers})
      this->*field = this->*field > o.*field ? this->*field : o.*field;
  }
};

// Where a runtime resumed (Checkpointer::resumed): the checkpoint folder and
// the steps it had taken, the next step's index, and the seconds the load
// took; an empty folder when it did not.
struct ResumePoint {
  std::string folder;
  int64_t step = 0;
  double seconds = 0;
  explicit operator bool() const { return !folder.empty(); }
};

struct StepResult {
  int64_t step = 0;         // 0-based index of the step just taken
  double loss = 0;          // mean training loss over the global batch (same on every rank)
  double grad_norm = 0;     // global gradient norm before clipping
  // After a step each .grad holds the gradient of the loss summed over the
  // step's items (samples, or the adapter's counted items), not clipped; the
  // optimizer used grad_scale x .grad (1 / items times the clipping
  // coefficient), applied on the fly rather than by extra passes.
  double grad_scale = 1;
  double lr = 0;
  double seconds = 0;       // wall time of the step
  int64_t peak_activation_bytes = 0;  // this rank, during the step (CPU; on a GPU the allocator's peak above the step start)
  // fp16 (train.precision): the loss scale the step ran with, and whether its
  // gradients overflowed so the optimizer skipped it (the scale was then halved).
  double loss_scale = 1;
  bool skipped = false;
  // train.val_every, in smp::Trainer's steps: the validation loss evaluated
  // after this step, NaN when it did not validate.
  double validation_loss = std::numeric_limits<double>::quiet_NaN();
  StepPhases phases;
  MemoryAccount memory;
  // The graph's metrics (graph.metric) over this step's training microbatches
  // on every rank: sum / count, in the order the adapter declared them.
  std::vector<std::pair<std::string, double>> metrics;
};

}  // namespace smp
#pragma GCC visibility pop
