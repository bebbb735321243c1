#include "memory/activation_checkpoint.h"

#include <smp/error.h>
#include <smp/model_graph.h>

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace smp {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct CallHolder : torch::CustomClassHolder {
  explicit CallHolder(ModuleCall c) : call(std::move(c)) {}
  ModuleCall call;
};

struct Checkpoint : torch::autograd::Function<Checkpoint> {
  // The inputs come as a TensorList: Function::apply takes a std::vector as an
  // opaque argument, not as tensors to differentiate.
  static variable_list forward(AutogradContext* ctx, at::TensorList input_list, c10::intrusive_ptr<CallHolder> call) {
    const variable_list inputs = input_list.vec();
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    ctx->save_for_backward(inputs);
    variable_list outs = call->call(inputs);  // grad mode is off inside forward
    for (const auto& o : outs)
      if (o.defined() && !o.is_floating_point()) ctx->mark_non_differentiable({o});
    return outs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto call = c10::static_intrusive_pointer_cast<CallHolder>(ctx->saved_data["call"].toCapsule());
    variable_list inputs;
    const variable_list saved = ctx->get_saved_variables();
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

}  // namespace

std::vector<bool> select_checkpointed(const ModelGraph& graph, const std::vector<std::string>& entries, int every,
                                      const std::string& origin) {
  auto matches = [](const GraphNode& n, const std::string& e) {
    return n.kind == e || n.name == e || n.name.rfind(e + ".", 0) == 0;
  };
  std::vector<bool> out(graph.nodes.size(), false);
  for (const auto& e : entries) {
    bool any = false;
    for (const auto& n : graph.nodes) any = any || matches(n, e);
    if (!any) {
      std::string kinds;
      for (const auto& n : graph.nodes)
        if (kinds.find("\"" + n.kind + "\"") == std::string::npos) kinds += (kinds.empty() ? "\"" : ", \"") + n.kind + "\"";
      throw Error(origin + ": memory.checkpoint: \"" + e + "\" matches no node's kind, name or name prefix (kinds: " +
                  kinds + ")");
    }
  }
  int matched = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    bool hit = false;
    for (const auto& e : entries) hit = hit || matches(graph.nodes[i], e);
    if (hit) out[i] = matched++ % every == 0;
  }
  return out;
}

std::vector<at::Tensor> checkpointed(const ModuleCall& call, const std::vector<at::Tensor>& inputs) {
  bool needs_grad = false;
  for (const auto& t : inputs) needs_grad = needs_grad || (t.defined() && t.requires_grad());
  if (!at::GradMode::is_enabled() || !needs_grad) {
    // Nothing upstream needs a gradient through the inputs, but the module's own
    // parameters may: run it the plain way so they still get theirs.
    return call(inputs);
  }
  return Checkpoint::apply(at::TensorList(inputs), c10::make_intrusive<CallHolder>(call));
}

}  // namespace smp
