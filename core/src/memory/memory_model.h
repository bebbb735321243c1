// The memory manager's model of a rank's memory, from the graph's cost hints
// (per node: fp32 parameter bytes, activation bytes per sample), the stage
// plan, the schedule and the memory options, without allocating anything.
// The same model gives the partitioner its per-node memory cost and
// smp-launch --estimate-memory its per-rank estimate.
//
// The hints are per rank: parallel rules scale them by the fractions their
// rules split (smp_rule's param_split / activation_split).
// Per pp rank, with N = the parameter elements it holds (a shared module once),
// c = compute-dtype bytes, g = gradient-dtype bytes:
//   parameters       N c, / dp under ZeRO-3
//   gradients        N g (the accumulation buckets; under ZeRO the reduced shard is a slice of them)
//   optimizer state  8 N (AdamW's moments) + 4 N (fp32 masters, 16-bit only), / dp under ZeRO >= 1
//   step peak        the schedule walked action by action: every microbatch
//                    forwarded and not yet backwarded keeps its activations
//                    (a checkpointed node only its input); a backward adds its
//                    working set (the gradients flowing through the stage and
//                    the recomputed node; at the loss, twice what the loss
//                    node keeps: its input's gradient and one temporary of
//                    that size; on a stage fed by another, the gradient
//                    it sends back); under ZeRO-3 three units are gathered
//                    (the one in use, the prefetched one and, in backward,
//                    the one before until its gradients are in). A node
//                    recomputing its attention core keeps its hint less the
//                    core's (attention_core_bytes_hint); under 16-bit precision
//                    a node keeps activation_fp32_extra_bytes_hint more.
//                    Offload: checkpointed inputs wait in host memory
//                    (`offloaded`), and at most horizon + 1 slots of them are
//                    back on the device during backward.
#pragma once

#include <smp/model_graph.h>
#include <smp/stage_plan.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace smp {

struct Schedule;

struct MemoryModelOptions {
  int pp = 1, tp = 1, dp = 1;
  int zero = 0;
  int compute_bytes = 4;   // 2 for bf16 / fp16
  int grad_bytes = 4;      // train.grad_reduce_dtype
  bool masters = false;    // fp32 master weights (16-bit precision)
  int64_t microbatch_samples = 1;
  std::vector<bool> checkpoint;  // per node
  std::vector<bool> recompute_core;  // per node: memory.checkpoint_attention_core
  bool offload = false;
  int offload_horizon = 4;
};

struct RankMemory {
  int pp_rank = 0;
  double parameters = 0, gradients = 0, optimizer_state = 0, step_peak = 0;
  double offloaded = 0;  // host memory (memory.offload), not in the total
  double total() const { return parameters + gradients + optimizer_state + step_peak; }
};

// The partitioner's per-node memory cost: the node's parameter state (as
// above, for this job's precision and ZeRO stage) plus its activations for one
// microbatch (what a checkpointed node keeps, if checkpointed).
std::vector<NodeCost> memory_costs(const ModelGraph& graph, const MemoryModelOptions& o, std::vector<NodeCost> costs);

// One entry per pp rank (every dp / tp rank of a pp rank alike).
std::vector<RankMemory> estimate_memory(const ModelGraph& graph, const StagePlan& plan, const Schedule& schedule,
                                        const MemoryModelOptions& o);

nlohmann::json to_json(const RankMemory& m);

}  // namespace smp
