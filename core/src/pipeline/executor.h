// Runs a pipeline Schedule on this rank: forward/backward of the local stages,
// activations and gradients over the pp communicator, gradient accumulation.
#pragma once

#include <smp/model_graph.h>
#include <smp/stage_plan.h>

#include "schedule/schedule.h"
#include "plugin/module_instance.h"
#include "graph/loss_normalizer.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace smp {

class ActivationOffload;
class Communicator;
class ShardedParameters;
class Work;

struct ExecutorSetup {
  const ModelGraph* graph = nullptr;
  const StagePlan* plan = nullptr;
  int pp_rank = 0;
  // The pp groups (null when pp == 1): messages to a higher pp rank go through
  // pp_comm, to a lower one through pp_down_comm, so that under NCCL each
  // direction of a pair has a stream of its own and a send never waits behind
  // one of the other direction (schedule/nccl_order.h). pp_down_comm null:
  // both directions through pp_comm.
  Communicator* pp_comm = nullptr;
  Communicator* pp_down_comm = nullptr;
  const std::map<std::string, std::shared_ptr<ModuleInstance>>* modules = nullptr;  // by module key
  // The graph inputs of one microbatch (graph.inputs order) for a step.
  std::function<std::vector<at::Tensor>(int64_t step, int microbatch, bool training)> batch;
  uint64_t seed = 0;
  const LossNormalizer* loss = nullptr;  // seeds backward, sums the losses
  // Where this rank computes: graph inputs and received activations go there,
  // floating inputs in the compute dtype (train.precision). The activation
  // headers stay on the CPU (Gloo), the payload on the device (NCCL).
  c10::Device device = c10::Device(c10::kCPU);
  at::ScalarType compute_dtype = at::kFloat;
  // The memory manager's per-node choices: ZeRO-3 gathers a module's
  // parameters around each call (null = parameters always whole); checkpoint[i]
  // recomputes graph node i's activations in backward (empty = none).
  ShardedParameters* gather = nullptr;
  std::vector<bool> checkpoint;
  // memory.offload: checkpointed nodes keep their inputs in host memory,
  // loaded back `horizon` backward passes ahead (null = on the device).
  ActivationOffload* offload = nullptr;
};

struct ExecutorResult {
  LossSums loss;         // this rank's microbatch losses (last stage only, else 0)
  int losses = 0;        // microbatches that produced a loss here
  int64_t peak_bytes = 0;  // peak bytes allocated on this thread during the run
  int64_t offloaded_peak_bytes = 0;  // most host bytes held for offloaded activations at once
  // Activations by schedule slot (microbatch, chunk): what each slot's forward
  // kept (bytes allocated by it and still held after it), the largest slot,
  // and the most held at once by slots forwarded and not yet done.
  int64_t activation_peak_bytes = 0, largest_slot_bytes = 0;
  // Communication buffers: the most bytes pipeline sends in flight held at once.
  int64_t send_buffer_peak_bytes = 0;
  // Per graph metric: {sum, count} over the microbatches whose metric node ran here.
  std::vector<std::pair<double, double>> metrics;
};

class Executor {
 public:
  explicit Executor(ExecutorSetup setup);
  // Training: forward + backward for every microbatch; .grad accumulates the
  // gradient of the summed loss (see LossNormalizer). Evaluation: forwards only.
  // loss_scale: the fp16 loss scale the backward seeds are multiplied by (1 otherwise).
  ExecutorResult run(const Schedule& schedule, int64_t step, bool training, double loss_scale = 1.0);
  // Forward-only runs that keep graph values (Runtime::forward): while set, a
  // node whose inputs are not all there is skipped (an input the batch left
  // out, e.g. the targets), and every value in `values` this rank computes is
  // stored in (*sink)[value][microbatch]. Null values: back to normal.
  void capture(const std::set<std::string>* values, std::map<std::string, std::map<int, at::Tensor>>* sink) {
    capture_ = values;
    captured_ = sink;
  }
  // Where a decoding run's inputs lie, carried by every module call while set; null: not decoding.
  void decode_positions(const DecodePositions* decode) { decode_ = decode; }

 private:
  struct Slot;  // one (microbatch, chunk) in flight
  void forward(Slot& slot, int64_t step, int mb, int chunk, bool training);
  void backward(Slot& slot, bool input_part, bool weight_part);
  void backward_pass(Slot& slot, int mb, bool input_part, bool weight_part);
  void send_activations(Slot& slot, int mb, int chunk, int peer);
  void recv_activations(Slot& slot, int mb, int chunk, int peer, bool training);
  void send_grads(Slot& slot, int mb, int chunk, int peer);
  void recv_grads(Slot& slot, int mb, int chunk, int peer);
  const std::vector<at::Tensor>& microbatch_inputs(int64_t step, int mb, bool training);
  // ZeRO-3: the module key (unit) of each parameter, by TensorImpl.
  const std::unordered_map<const void*, std::string>& unit_of_parameter();
  int stage_of(int chunk) const { return chunk * setup_.plan->pp + setup_.pp_rank; }
  // The group that carries messages from pp rank `from` to pp rank `to`.
  Communicator& pp_link(int from, int to) const;

  ExecutorSetup setup_;
  int microbatches_ = 1;  // of the schedule being run
  std::map<int, std::vector<at::Tensor>> batch_cache_;
  std::unordered_map<const void*, std::string> unit_of_parameter_;
  std::vector<std::pair<double, double>> metrics_;  // this run's metric sums (see ExecutorResult)
  // Sends in flight, with the buffers they read from (they must outlive the send).
  std::vector<std::pair<std::shared_ptr<Work>, at::Tensor>> pending_sends_;
  const std::set<std::string>* capture_ = nullptr;
  std::map<std::string, std::map<int, at::Tensor>>* captured_ = nullptr;
  const DecodePositions* decode_ = nullptr;
  double loss_scale_ = 1.0;  // of the run in progress
};

}  // namespace smp
