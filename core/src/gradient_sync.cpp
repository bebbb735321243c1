#include "gradient_sync.h"

#include <smp/communicator.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

namespace smp {

struct GradientSync::Bucket {
  std::vector<size_t> params;
  int pending = 0;  // params whose gradient is not final yet
  at::Tensor flat;
  std::shared_ptr<Work> work;
  bool launched = false;
};

// Runs after a parameter's AccumulateGrad, i.e. once its .grad includes this
// backward pass (what PyTorch's DDP reducer hooks too).
struct GradientSync::Hook : torch::autograd::FunctionPostHook {
  GradientSync* sync;
  size_t index;
  Hook(GradientSync* s, size_t i) : sync(s), index(i) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    sync->on_grad(index);
    return outputs;
  }
};

GradientSync::GradientSync(std::vector<SyncedParameter> params, Communicator* dp, Communicator* tp,
                           int64_t bucket_bytes)
    : params_(std::move(params)), dp_(dp && dp->size() > 1 ? dp : nullptr), tp_(tp), overlap_(bucket_bytes > 0) {
  bucket_of_.assign(params_.size(), -1);
  seen_.assign(params_.size(), 0);
  if (!dp_) return;
  // Gradients become final roughly in reverse registration order.
  int64_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& t = params_[k].tensor;
    if (!t.requires_grad()) continue;
    if (buckets_.empty() || (overlap_ && bytes >= bucket_bytes)) {
      buckets_.push_back(std::make_unique<Bucket>());
      bytes = 0;
    }
    buckets_.back()->params.push_back(k);
    bucket_of_[k] = static_cast<int>(buckets_.size()) - 1;
    bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  if (overlap_)
    for (size_t k = 0; k < params_.size(); ++k)
      if (bucket_of_[k] >= 0)
        torch::autograd::impl::grad_accumulator(params_[k].tensor)->add_post_hook(std::make_unique<Hook>(this, k));
}

GradientSync::~GradientSync() = default;

void GradientSync::begin_step() {
  std::fill(seen_.begin(), seen_.end(), 0);
  next_launch_ = 0;
  for (auto& b : buckets_) {
    b->pending = static_cast<int>(b->params.size());
    b->launched = false;
    b->work.reset();
  }
}

void GradientSync::on_grad(size_t k) {
  if (bucket_of_[k] < 0 || !overlap_) return;
  if (++seen_[k] == params_[k].expected_grads) {
    --buckets_[bucket_of_[k]]->pending;
    launch_ready();
  }
}

// Buckets go out strictly in order so every dp rank issues the same sequence of collectives.
void GradientSync::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->pending == 0) launch(*buckets_[next_launch_++]);
}

void GradientSync::launch(Bucket& b) {
  std::vector<at::Tensor> grads;
  for (size_t k : b.params) {
    at::Tensor& t = params_[k].tensor;
    if (!t.grad().defined()) t.mutable_grad() = at::zeros_like(t);
    grads.push_back(t.grad().reshape({-1}));
  }
  b.flat = at::cat(grads);
  b.work = dp_->allreduce(b.flat);
  b.launched = true;
}

void GradientSync::finish_step() {
  while (next_launch_ < buckets_.size()) launch(*buckets_[next_launch_++]);
  const double scale = dp_ ? 1.0 / dp_->size() : 1.0;
  for (auto& b : buckets_) {
    b->work->wait();
    int64_t offset = 0;
    for (size_t k : b->params) {
      at::Tensor& t = params_[k].tensor;
      int64_t n = t.numel();
      t.mutable_grad().copy_(b->flat.narrow(0, offset, n).view_as(t)).mul_(scale);
      offset += n;
    }
    b->flat = at::Tensor();
  }
  for (auto& p : params_) {
    if (!p.tensor.requires_grad()) continue;
    if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    if (p.tp_grad_sum && tp_ && tp_->size() > 1) tp_->allreduce(p.tensor.mutable_grad())->wait();
    if (p.tied) p.tied->allreduce(p.tensor.mutable_grad())->wait();
  }
}

}  // namespace smp
