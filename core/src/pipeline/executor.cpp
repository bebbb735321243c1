#include "pipeline/executor.h"

#include <smp/error.h>

#include "comm/communicator.h"
#include "memory/activation_checkpoint.h"
#include "memory/activation_offload.h"
#include "memory/memory_tracker.h"
#include "memory/sharded_parameters.h"
#include "pipeline/backward_split.h"
#include "pipeline/offload_prefetch.h"
#include "base/device.h"
#include "base/pipeline_limits.h"
#include "base/seeds.h"
#include "base/test_faults.h"
#include "base/trace.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <functional>

namespace smp {

namespace {

constexpr int kMaxValues = pipeline_limits::kValues;
constexpr int kHeaderLen = 256;

// Tags keep messages of different microbatches/chunks/values apart on one
// pair; the config refuses counts beyond what they can tell apart.
int tag(int kind, int mb, int chunk, int index) { return pipeline_limits::tag(kind, mb, chunk, index); }

int64_t dtype_code(at::ScalarType t) { return static_cast<int64_t>(t); }

}  // namespace

struct Executor::Slot {
  std::map<std::string, at::Tensor> env;     // values alive for this microbatch on this stage
  std::vector<std::string> received;         // values that came from the previous stage
  std::map<std::string, at::Tensor> leaves;  // received floating values (autograd leaves)
  std::map<std::string, at::Tensor> grads_in;   // grads of sent values, from the next stage
  std::map<std::string, at::Tensor> grads_out;  // grads of received values, for the previous stage
  at::Tensor loss;
  at::Tensor loss_count;  // LossReduction::Sum only
  std::unique_ptr<BackwardSplit> split;  // between BackwardInput and BackwardWeight
  bool weight_done = false;
  bool grads_sent = false;
  int64_t activation_bytes = 0;  // what this slot's forward kept
};

Executor::Executor(ExecutorSetup setup) : setup_(std::move(setup)) {
  for (int s = 0; s < setup_.plan->num_stages(); ++s)
    if (setup_.plan->sent_after[s].size() > kMaxValues)
      throw Error("stage " + std::to_string(s) + " sends " + std::to_string(setup_.plan->sent_after[s].size()) +
                  " values to the next stage; at most " + std::to_string(kMaxValues) + " are supported");
}

const std::vector<at::Tensor>& Executor::microbatch_inputs(int64_t step, int mb, bool training) {
  auto it = batch_cache_.find(mb);
  if (it == batch_cache_.end()) {
    // The adapter's tensors (CPU) go to this rank's device; floating ones in the compute dtype.
    std::vector<at::Tensor> inputs = [&] {
      trace::Scope data("data", "batch");
      return setup_.batch(step, mb, training);
    }();
    for (auto& t : inputs)
      if (t.defined())
        t = t.to(setup_.device, t.is_floating_point() ? setup_.compute_dtype : t.scalar_type());
    it = batch_cache_.emplace(mb, std::move(inputs)).first;
  }
  return it->second;
}

void Executor::forward(Slot& slot, int64_t step, int mb, int chunk, bool training) {
  const ModelGraph& g = *setup_.graph;
  const int stage = stage_of(chunk);
  if (!setup_.plan->inputs_of_stage[stage].empty()) {
    const auto& inputs = microbatch_inputs(step, mb, training);
    for (const auto& name : setup_.plan->inputs_of_stage[stage]) {
      auto pos = std::find(g.inputs.begin(), g.inputs.end(), name) - g.inputs.begin();
      if (inputs.at(pos).defined()) slot.env[name] = inputs.at(pos);  // undefined: left out of a forward-only batch
    }
  }
  const std::vector<int>& nodes = setup_.plan->nodes_of_stage[stage];
  ShardedParameters* gather = setup_.gather;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const GraphNode& node = g.nodes[nodes[i]];
    const std::string& key = node.module_key();
    if (capture_ && !std::all_of(node.inputs.begin(), node.inputs.end(),
                                 [&](const std::string& v) { return slot.env.count(v) > 0; }))
      continue;  // forward only: an input the batch left out
    std::vector<at::Tensor> ins;
    ins.reserve(node.inputs.size());
    for (const auto& v : node.inputs) ins.push_back(slot.env.at(v));
    const uint64_t rng = derive_seed(setup_.seed, node.name, {step, mb});
    std::shared_ptr<ModuleInstance> module = setup_.modules->at(key);
    // The call, as a checkpointed node's backward repeats it (same seed, so the same dropout masks).
    const DecodePositions* decode = decode_;
    ModuleCall call = [module, &node, training, rng, gather, decode](const std::vector<at::Tensor>& in) {
      if (gather) gather->acquire(node.module_key());
      return module->call(node.name, node.method, in, node.outputs.size(), training, rng, decode);
    };
    const std::string* next = i + 1 < nodes.size() ? &g.nodes[nodes[i + 1]].module_key() : nullptr;
    if (gather) {
      gather->acquire(key);
      if (next && *next != key) gather->prefetch(*next);  // gathered while this module computes
    }
    const bool recompute = training && !setup_.checkpoint.empty() && setup_.checkpoint[nodes[i]];
    sdk::InputStash* stash = recompute && setup_.offload ? setup_.offload->stash(mb, chunk) : nullptr;
    auto outs = recompute ? checkpointed(call, ins, stash) : call(ins);
    if (gather) {
      if (!next || *next != key) gather->release(key);
      // Backward gathers the parameters again before this module's gradients
      // are computed (a hook on its outputs' gradients), and prefetches the
      // module before it; GradientSync frees them once their gradients are in.
      if (training) {
        const std::string prev = i > 0 ? g.nodes[nodes[i - 1]].module_key() : std::string();
        for (auto& o : outs)
          if (o.defined() && o.requires_grad())
            o.register_hook([gather, key, prev](const at::Tensor& grad) {
              gather->acquire(key);
              if (!prev.empty() && prev != key) gather->prefetch(prev);
              return grad;
            });
      }
    }
    for (size_t j = 0; j < outs.size(); ++j) {
      if (capture_ && capture_->count(node.outputs[j])) (*captured_)[node.outputs[j]][mb] = outs[j].detach();
      slot.env[node.outputs[j]] = std::move(outs[j]);
    }
  }
  if (stage == setup_.plan->num_stages() - 1 && slot.env.count(g.loss)) {
    slot.loss = slot.env.at(g.loss);
    if (slot.loss.numel() != 1) {
      std::string shape;
      for (int64_t d : slot.loss.sizes()) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      throw Error("the loss '" + g.loss + "' is not a scalar (shape [" + shape + "]): the graph's loss node must "
                  "reduce it (a mean over the microbatch's samples, or a sum with a count)");
    }
    if (!g.loss_count.empty()) slot.loss_count = slot.env.at(g.loss_count);
  }
  // Metrics computed on this stage (not received from the one before).
  for (size_t k = 0; k < g.metrics.size(); ++k) {
    auto s = slot.env.find(g.metrics[k].sum);
    if (s == slot.env.end() || !slot.env.count(g.metrics[k].count) ||
        std::find(slot.received.begin(), slot.received.end(), g.metrics[k].sum) != slot.received.end())
      continue;
    metrics_[k].first += s->second.detach().to(at::kDouble).sum().item<double>();
    metrics_[k].second += slot.env.at(g.metrics[k].count).detach().to(at::kDouble).sum().item<double>();
  }
  // Keep only what later work needs: values sent on, and (for backward) everything
  // is referenced by the autograd graph anyway.
  std::map<std::string, at::Tensor> keep;
  for (const auto& v : setup_.plan->sent_after[stage]) {
    auto it = slot.env.find(v);
    if (it != slot.env.end()) keep[v] = it->second;
    else if (!capture_) throw Error("pipeline: stage " + std::to_string(stage) + " did not compute '" + v + "', which it sends on");
  }
  slot.env = std::move(keep);
}

Communicator& Executor::pp_link(int from, int to) const {
  // SMP_TEST_FAULT=pipeline_one_stream: both directions on one group, as plain
  // c10d send/recv would put them (1F1B then deadlocks under NCCL's rules).
  if (to < from && setup_.pp_down_comm && !test_fault(TestFault::PipelineOneStream)) return *setup_.pp_down_comm;
  return *setup_.pp_comm;
}

void Executor::send_activations(Slot& slot, int mb, int chunk, int peer) {
  const auto& values = setup_.plan->sent_after[stage_of(chunk)];
  auto header = at::zeros({kHeaderLen}, at::kLong);
  auto* h = header.data_ptr<int64_t>();
  int pos = 0;
  h[pos++] = static_cast<int64_t>(values.size());
  std::vector<at::Tensor> payload;
  for (const auto& v : values) {
    auto found = slot.env.find(v);
    if (found == slot.env.end()) {  // forward only: not computed here (an input was left out)
      h[pos++] = -1;
      h[pos++] = 0;
      payload.emplace_back();
      continue;
    }
    at::Tensor t = found->second.detach().contiguous();
    if (pos + 2 + t.dim() > kHeaderLen) throw Error("activation header overflow at value '" + v + "'");
    h[pos++] = dtype_code(t.scalar_type());
    h[pos++] = t.dim();
    for (auto d : t.sizes()) h[pos++] = d;
    payload.push_back(t);
  }
  Communicator& link = pp_link(setup_.pp_rank, peer);
  pending_sends_.emplace_back(link.send(header, peer, tag(0, mb, chunk, 0)), header);
  for (size_t i = 0; i < payload.size(); ++i)
    if (payload[i].defined())
      pending_sends_.emplace_back(link.send(payload[i], peer, tag(0, mb, chunk, static_cast<int>(i) + 1)), payload[i]);
}

void Executor::recv_activations(Slot& slot, int mb, int chunk, int peer, bool training) {
  // chunk is the consuming chunk; the producer used its own chunk number in the tag.
  const int stage = stage_of(chunk);
  const int producer_chunk = (stage - 1) / setup_.plan->pp;
  const auto& values = setup_.plan->sent_after[stage - 1];
  // SMP_TEST_FAULT=pipeline_pairing: microbatches 2k and 2k+1 swap their activations.
  if (test_fault(TestFault::PipelinePairing) && (mb ^ 1) < microbatches_) mb ^= 1;
  Communicator& link = pp_link(peer, setup_.pp_rank);
  auto header = at::empty({kHeaderLen}, at::kLong);
  link.recv(header, peer, tag(0, mb, producer_chunk, 0))->wait();
  const auto* h = header.data_ptr<int64_t>();
  int pos = 0;
  if (h[pos++] != static_cast<int64_t>(values.size()))
    throw Error("pipeline: stage " + std::to_string(stage) + " expected " + std::to_string(values.size()) +
                " values from stage " + std::to_string(stage - 1) + ", header says " + std::to_string(h[0]));
  for (size_t i = 0; i < values.size(); ++i) {
    const int64_t code = h[pos++];
    int64_t ndim = h[pos++];
    if (code < 0) continue;  // not computed by the sender (forward only)
    auto dtype = static_cast<at::ScalarType>(code);
    std::vector<int64_t> sizes(h + pos, h + pos + ndim);
    pos += static_cast<int>(ndim);
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype).device(setup_.device));
    link.recv(t, peer, tag(0, mb, producer_chunk, static_cast<int>(i) + 1))->wait();
    if (training && t.is_floating_point()) {
      t.requires_grad_(true);
      slot.leaves[values[i]] = t;
    }
    slot.env[values[i]] = t;
    slot.received.push_back(values[i]);
  }
}

void Executor::send_grads(Slot& slot, int mb, int chunk, int peer) {
  int i = 0;
  for (const auto& v : slot.received) {
    ++i;
    auto it = slot.grads_out.find(v);
    if (it == slot.grads_out.end()) continue;  // not floating: no gradient travels
    at::Tensor g = it->second.contiguous();
    pending_sends_.emplace_back(pp_link(setup_.pp_rank, peer).send(g, peer, tag(1, mb, chunk, i)), g);
  }
}

void Executor::recv_grads(Slot& slot, int mb, int chunk, int peer) {
  const int stage = stage_of(chunk);
  const int consumer_chunk = (stage + 1) / setup_.plan->pp;
  int i = 0;
  for (const auto& v : setup_.plan->sent_after[stage]) {
    ++i;
    const at::Tensor& value = slot.env.at(v);
    if (!value.is_floating_point()) continue;
    at::Tensor g = at::empty(value.sizes(), value.options().requires_grad(false));
    pp_link(peer, setup_.pp_rank).recv(g, peer, tag(1, mb, consumer_chunk, i))->wait();
    slot.grads_in[v] = g;
  }
}

void Executor::backward(Slot& slot, bool input_part, bool weight_part) {
  if (!input_part) {  // BackwardWeight: what BackwardInput left (nothing when no root needed a gradient)
    if (!slot.split) return;
    // ZeRO-3: a unit freed since BackwardInput is gathered again before its weights' kernels run.
    auto gather_units = [this](const std::vector<at::Tensor>& params) {
      for (const auto& p : params) {
        auto unit = unit_of_parameter().find(p.unsafeGetTensorImpl());
        if (unit != unit_of_parameter().end()) setup_.gather->acquire(unit->second);
      }
    };
    slot.split->weight_pass(setup_.gather ? std::function<void(const std::vector<at::Tensor>&)>(gather_units)
                                          : nullptr);
    slot.split.reset();
    return;
  }
  std::vector<at::Tensor> roots, grads;
  std::map<std::string, at::Tensor> passthrough;  // received values sent on unchanged
  if (slot.loss.defined()) {
    roots.push_back(slot.loss);
    grads.push_back(at::full({}, setup_.loss->backward_seed(loss_scale_), slot.loss.options().requires_grad(false)));
  }
  for (const auto& [v, g] : slot.grads_in) {
    const at::Tensor& value = slot.env.at(v);
    if (slot.leaves.count(v) && slot.leaves.at(v).unsafeGetTensorImpl() == value.unsafeGetTensorImpl()) {
      passthrough[v] = g;
      continue;
    }
    if (!value.requires_grad()) continue;
    roots.push_back(value);
    grads.push_back(g);
  }
  std::vector<std::string> leaf_names;
  std::vector<at::Tensor> leaves;
  for (const auto& [v, t] : slot.leaves) {
    leaf_names.push_back(v);
    leaves.push_back(t);
  }
  auto finish_inputs = [&](const std::vector<at::Tensor>& leaf_grads) {
    for (size_t i = 0; i < leaf_names.size(); ++i) {
      at::Tensor g = i < leaf_grads.size() && leaf_grads[i].defined() ? leaf_grads[i] : at::zeros_like(leaves[i]).detach();
      auto p = passthrough.find(leaf_names[i]);
      if (p != passthrough.end()) g = g + p->second;
      slot.grads_out[leaf_names[i]] = g.detach();
    }
  };
  if (roots.empty()) {  // nothing computed here needs a gradient: pass through
    finish_inputs({});
    return;
  }
  if (weight_part) {
    torch::autograd::backward(roots, grads, /*retain_graph=*/false);
    std::vector<at::Tensor> lg;
    for (auto& l : leaves) lg.push_back(l.grad());
    finish_inputs(lg);
  } else {  // BackwardInput: the input gradients now, the weights' later (zero-bubble split)
    slot.split = std::make_unique<BackwardSplit>();
    finish_inputs(slot.split->input_pass(roots, grads, leaves));
  }
}

// One backward pass (whole, or the input or weight part): ZeRO-3 counts the
// units' gradients within it and frees what it left gathered at its end.
void Executor::backward_pass(Slot& slot, int mb, bool input_part, bool weight_part) {
  // SMP_TEST_FAULT=dropped_microbatch_gradient: microbatch 1 sends no gradient back.
  if (mb == 1 && slot.loss.defined() && input_part && test_fault(TestFault::DroppedMicrobatchGradient))
    slot.loss = slot.loss * 0.0;
  if (setup_.gather) setup_.gather->begin_backward_pass();
  backward(slot, input_part, weight_part);
  if (setup_.gather) setup_.gather->end_backward_pass();
}

const std::unordered_map<const void*, std::string>& Executor::unit_of_parameter() {
  if (unit_of_parameter_.empty())
    for (const auto& [key, module] : *setup_.modules)
      for (const auto& p : module->parameters()) unit_of_parameter_[p.tensor.unsafeGetTensorImpl()] = key;
  return unit_of_parameter_;
}

ExecutorResult Executor::run(const Schedule& schedule, int64_t step, bool training, double loss_scale) {
  ExecutorResult result;
  loss_scale_ = loss_scale;
  microbatches_ = schedule.microbatches;
  MemoryTracker memory;
  std::map<std::pair<int, int>, Slot> slots;
  batch_cache_.clear();
  metrics_.assign(setup_.graph->metrics.size(), {0.0, 0.0});
  torch::autograd::AutoGradMode grad_mode(training);
  const int last_stage = setup_.plan->num_stages() - 1;
  // Offload: each backward (whole or its input part) starts loading the
  // inputs of itself and the next `horizon` backwards (a slot not forwarded
  // yet has none: its own backward loads it).
  const std::vector<Action>& actions = schedule.actions.at(setup_.pp_rank);
  const std::vector<std::vector<SlotKey>> prefetches =
      setup_.offload ? offload_prefetches(actions, setup_.offload->horizon()) : std::vector<std::vector<SlotKey>>{};
  size_t action_index = 0;
  // Bytes held now on this rank's device (the CPU allocator on this thread, or CUDA's).
  auto held = [&] { return setup_.device.is_cuda() ? device_allocated_bytes(setup_.device) : memory.current(); };
  int64_t slots_live = 0;
  for (const Action& a : actions) {
    if (setup_.offload && training)
      for (const SlotKey& s : prefetches[action_index]) setup_.offload->prefetch(s.first, s.second);
    ++action_index;
    const bool backward_op = a.op == Op::Backward || a.op == Op::BackwardInput || a.op == Op::BackwardWeight ||
                             a.op == Op::SendGrad || a.op == Op::RecvGrad;
    if (!training && backward_op) continue;
    const std::pair<int, int> key{a.microbatch, a.chunk};
    Slot& slot = slots[key];
    const int stage = stage_of(a.chunk);
    trace::Scope traced(is_compute(a.op) ? "compute" : "p2p", to_string(a),
                        {{"microbatch", static_cast<double>(a.microbatch)}, {"chunk", static_cast<double>(a.chunk)}});
    switch (a.op) {
      case Op::RecvActivation: recv_activations(slot, a.microbatch, a.chunk, a.peer, training); break;
      case Op::Forward: {
        const int64_t before = held();
        forward(slot, step, a.microbatch, a.chunk, training);
        slot.activation_bytes = std::max<int64_t>(0, held() - before);
        slots_live += slot.activation_bytes;
        result.activation_peak_bytes = std::max(result.activation_peak_bytes, slots_live);
        result.largest_slot_bytes = std::max(result.largest_slot_bytes, slot.activation_bytes);
        if (stage == last_stage && slot.loss.defined()) {
          setup_.loss->add(result.loss, slot.loss, slot.loss_count);
          result.losses += 1;
        }
        break;
      }
      case Op::SendActivation: send_activations(slot, a.microbatch, a.chunk, a.peer); break;
      case Op::RecvGrad: recv_grads(slot, a.microbatch, a.chunk, a.peer); break;
      case Op::Backward:
        backward_pass(slot, a.microbatch, true, true);
        slot.weight_done = true;
        break;
      case Op::BackwardInput: backward_pass(slot, a.microbatch, true, false); break;
      case Op::BackwardWeight: backward_pass(slot, a.microbatch, false, true); slot.weight_done = true; break;
      case Op::SendGrad:
        send_grads(slot, a.microbatch, a.chunk, a.peer);
        slot.grads_sent = true;
        break;
    }
    // A slot lives until nothing scheduled needs it any more.
    bool finished = training ? slot.weight_done && (stage == 0 || slot.grads_sent)
                             : ((stage == last_stage && a.op == Op::Forward) || a.op == Op::SendActivation);
    if (finished) {
      slots_live -= slot.activation_bytes;
      slots.erase(key);
    }
    int64_t sends_live = 0;
    for (const auto& s : pending_sends_) sends_live += s.second.numel() * static_cast<int64_t>(s.second.element_size());
    result.send_buffer_peak_bytes = std::max(result.send_buffer_peak_bytes, sends_live);
    // Sends that completed release their buffers now, not at the end of the step.
    pending_sends_.erase(std::remove_if(pending_sends_.begin(), pending_sends_.end(),
                                        [](auto& s) {
                                          if (!s.first->ready()) return false;
                                          s.first->wait();  // surfaces a failed send
                                          return true;
                                        }),
                         pending_sends_.end());
  }
  for (auto& [work, buffer] : pending_sends_) work->wait();
  pending_sends_.clear();
  batch_cache_.clear();
  result.peak_bytes = memory.peak();
  result.metrics = metrics_;
  if (setup_.offload) {
    result.offloaded_peak_bytes = setup_.offload->host_peak_bytes();
    setup_.offload->clear();
  }
  return result;
}

}  // namespace smp
