#include "train/gradient_sync.h"

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "train/placement.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <map>
#include <stdexcept>
#include <string>

namespace smp {

SyncedParameter synced_parameter(const at::Tensor& tensor, const Placements& placements, ProcessGroups& groups) {
  SyncedParameter s;
  s.tensor = tensor;
  s.data_parallel = &groups.get(placements.data_parallel_axis());
  for (const auto& p : placements.list())
    if (p.kind == SMP_PLACEMENT_PARTIAL_GRAD) s.partial.push_back(&groups.get(p.axis));
  return s;
}

// A bucket owns one flat tensor and its parameters' .grad are views into it
// (DDP's gradient_as_bucket_view): backward accumulates straight into the
// buffer that is all-reduced, so a step copies no gradient in or out.
struct GradientSync::Bucket {
  Communicator* comm = nullptr;
  std::vector<size_t> params;
  int pending = 0;  // params whose gradient is not final yet
  at::Tensor flat;
  std::shared_ptr<Work> work;
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

GradientSync::GradientSync(std::vector<SyncedParameter> params, int64_t bucket_bytes)
    : params_(std::move(params)), overlap_(bucket_bytes > 0) {
  bucket_of_.assign(params_.size(), -1);
  seen_.assign(params_.size(), 0);
  // Gradients become final roughly in reverse registration order. A bucket
  // holds one group's parameters of one dtype; every rank of a group has the
  // same parameters, so it builds the same buckets and launches them in order.
  std::map<std::pair<Communicator*, int>, std::pair<int, int64_t>> open;  // (group, dtype) -> (bucket, bytes)
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& t = params_[k].tensor;
    Communicator* comm = params_[k].data_parallel;
    if (!t.requires_grad() || !comm || comm->size() == 1) continue;
    auto key = std::make_pair(comm, static_cast<int>(t.scalar_type()));
    auto it = open.find(key);
    if (it == open.end() || (overlap_ && it->second.second >= bucket_bytes)) {
      buckets_.push_back(std::make_unique<Bucket>());
      buckets_.back()->comm = comm;
      it = open.insert_or_assign(key, std::make_pair(static_cast<int>(buckets_.size()) - 1, int64_t{0})).first;
    }
    buckets_[it->second.first]->params.push_back(k);
    bucket_of_[k] = it->second.first;
    it->second.second += t.numel() * static_cast<int64_t>(t.element_size());
  }
  for (auto& b : buckets_) {
    int64_t numel = 0;
    for (size_t k : b->params) numel += params_[k].tensor.numel();
    b->flat = at::zeros({numel}, params_[b->params.front()].tensor.options().requires_grad(false));
    int64_t offset = 0;
    for (size_t k : b->params) {
      at::Tensor& t = params_[k].tensor;
      at::Tensor view = b->flat.narrow(0, offset, t.numel()).view_as(t);
      if (t.grad().defined()) view.copy_(t.grad());
      t.mutable_grad() = view;
      offset += t.numel();
    }
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
  for (size_t k : b.params) check_view(k, b);
  b.work = b.comm->allreduce(b.flat);
}

// Something replaced a .grad (set it to a new tensor or undefined) instead of
// accumulating into it: the bucket would reduce stale values, so stop loudly.
void GradientSync::check_view(size_t k, const Bucket& b) const {
  const at::Tensor& g = params_[k].tensor.grad();
  const auto* base = static_cast<const char*>(b.flat.data_ptr());
  const auto* p = g.defined() ? static_cast<const char*>(g.data_ptr()) : nullptr;
  if (!p || p < base || p >= base + b.flat.numel() * b.flat.element_size())
    throw std::logic_error("gradient sync: parameter " + std::to_string(k) +
                           "'s .grad no longer points into its dp bucket (it was replaced, not accumulated into)");
}

void GradientSync::finish_step() {
  while (next_launch_ < buckets_.size()) launch(*buckets_[next_launch_++]);
  for (auto& b : buckets_) b->work->wait();
  for (auto& p : params_) {
    if (!p.tensor.requires_grad()) continue;
    if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    for (Communicator* c : p.partial)
      if (c && c->size() > 1) c->allreduce(p.tensor.mutable_grad())->wait();
    if (p.tied && p.tied->size() > 1) p.tied->allreduce(p.tensor.mutable_grad())->wait();
  }
}

}  // namespace smp
