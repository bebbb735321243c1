// Activation checkpointing of a call, for the core and for plugins alike:
// forward runs `call` keeping only its inputs; backward runs it again with
// gradients on and back-propagates through the recomputed graph (the reentrant
// scheme of torch.utils.checkpoint). The call must draw its randomness from
// explicit seeds (smp's module calls and smp_nn's dropout do), so the
// recomputation sees the same masks.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <functional>
#include <vector>

namespace smp::sdk {

using TensorCall = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// Where a checkpoint keeps its inputs between forward and backward, when not
// as they are: keep() takes an input at forward and returns what gives it back
// at backward (e.g. the core's activation offload: a host copy, loaded ahead).
struct InputStash {
  virtual ~InputStash() = default;
  virtual std::function<at::Tensor()> keep(const at::Tensor& input) = 0;
};

namespace detail {

struct CallHolder : torch::CustomClassHolder {
  CallHolder(TensorCall c, InputStash* s) : call(std::move(c)), stash(s) {}
  TensorCall call;
  InputStash* stash;
  std::vector<std::function<at::Tensor()>> kept;  // the stashed inputs (stash only)
};

struct Checkpoint : torch::autograd::Function<Checkpoint> {
  using variable_list = torch::autograd::variable_list;
  // The inputs come as a TensorList: Function::apply takes a std::vector as an
  // opaque argument, not as tensors to differentiate.
  static variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList input_list,
                               c10::intrusive_ptr<CallHolder> call) {
    const variable_list inputs = input_list.vec();
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    if (call->stash) {
      for (const auto& in : inputs) call->kept.push_back(call->stash->keep(in));
    } else {
      ctx->save_for_backward(inputs);
    }
    variable_list outs = call->call(inputs);  // grad mode is off inside forward
    for (const auto& o : outs)
      if (o.defined() && !o.is_floating_point()) ctx->mark_non_differentiable({o});
    return outs;
  }

  static variable_list backward(torch::autograd::AutogradContext* ctx, variable_list grad_outputs) {
    auto call = c10::static_intrusive_pointer_cast<CallHolder>(ctx->saved_data["call"].toCapsule());
    variable_list inputs;
    variable_list saved;
    if (call->stash) {
      for (auto& give_back : call->kept) saved.push_back(give_back());
      call->kept.clear();
    } else {
      saved = ctx->get_saved_variables();
    }
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor d = saved[i].detach();
      if (ctx->needs_input_grad(i)) d.requires_grad_(true);
      inputs.push_back(d);
    }
    variable_list outs;
    {
      at::AutoGradMode grad(true);
      outs = call->call(inputs);
    }
    variable_list roots, grads;
    for (size_t i = 0; i < outs.size() && i < grad_outputs.size(); ++i)
      if (outs[i].defined() && outs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outs[i]);
        grads.push_back(grad_outputs[i]);
      }
    if (!roots.empty()) torch::autograd::backward(roots, grads);
    variable_list result;
    for (const auto& in : inputs) result.push_back(in.requires_grad() ? in.grad() : at::Tensor());
    result.emplace_back();  // the call itself
    return result;
  }
};

}  // namespace detail

// call(inputs), keeping only `inputs` for backward. Without grad mode, or when
// no input requires a gradient, it is just call(inputs): the outputs of a
// checkpoint require a gradient only through its inputs, so parameters used
// by a call on non-differentiable inputs would otherwise get none.
// stash: where the inputs wait for backward (null: kept as they are); it must
// outlive the backward.
inline std::vector<at::Tensor> checkpointed(const TensorCall& call, const std::vector<at::Tensor>& inputs,
                                            InputStash* stash = nullptr) {
  bool needs_grad = false;
  for (const auto& t : inputs) needs_grad = needs_grad || (t.defined() && t.requires_grad());
  if (!at::GradMode::is_enabled() || !needs_grad) return call(inputs);
  return detail::Checkpoint::apply(at::TensorList(inputs), c10::make_intrusive<detail::CallHolder>(call, stash));
}

}  // namespace smp::sdk
