#include "memory/gradient_sync.h"

#include "base/test_faults.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "mesh/placement.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

namespace smp {

SyncedParameter synced_parameter(const at::Tensor& tensor, const Placements& placements, ProcessGroups& groups) {
  SyncedParameter s;
  s.tensor = tensor;
  Axis data = placements.data_parallel_axis();
  // SMP_TEST_FAULT=expert_grad_wrong_group: an expert's gradient summed over dp, not edp.
  if (groups.mesh().role_of(data) == Role::ExpertBatch && test_fault(TestFault::ExpertGradWrongGroup))
    data = groups.mesh().axis_with(Role::Batch);
  s.data_parallel = &groups.get(data);
  for (const auto& p : placements.list())
    if (p.kind == PlacementKind::Partial) s.partial.push_back(&groups.get(p.axis));
  return s;
}

// A bucket owns one flat tensor and its parameters' .grad are views into it
// (DDP's gradient_as_bucket_view): backward accumulates straight into the
// buffer that is all-reduced, so a step copies no gradient in or out.
//
// A bucket whose dtype differs from its parameters' (fp32 gradients of bf16
// parameters) holds their main gradients instead: a hook after each
// AccumulateGrad adds .grad into the main buffer and drops .grad. Such buckets
// exist for every parameter that needs one, reduced or not (comm null or of size 1).
struct GradientSync::Bucket {
  Communicator* comm = nullptr;
  bool main = false;  // holds main gradients, not .grad views
  std::vector<size_t> params;
  int pending = 0;  // params whose gradient is not final yet
  at::Tensor flat;
  at::Tensor shard;     // ZeRO: this rank's reduced shard, a view of flat
  at::Tensor incoming;  // ZeRO-2/3: what the reduce-scatter writes, copied into shard after (only while in flight)
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

std::vector<ShardSegment> shard_segments(const std::vector<BucketLayout>& buckets) {
  std::vector<ShardSegment> out;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const BucketLayout& l = buckets[b];
    const int64_t lo = l.rank * l.shard, hi = lo + l.shard;
    for (size_t j = 0; j < l.params.size(); ++j) {
      const int64_t begin = std::max(lo, l.offsets[j]), end = std::min(hi, l.offsets[j] + l.numels[j]);
      if (begin < end) out.push_back({l.params[j], static_cast<int>(b), begin - l.offsets[j], begin - lo, end - begin});
    }
  }
  return out;
}

GradientSync::GradientSync(std::vector<SyncedParameter> params, GradientSyncOptions options)
    : params_(std::move(params)), overlap_(options.bucket_bytes > 0), zero_(options.zero) {
  const int64_t bucket_bytes = options.bucket_bytes;
  bucket_of_.assign(params_.size(), -1);
  seen_.assign(params_.size(), 0);
  main_.assign(params_.size(), at::Tensor());
  // Gradients become final roughly in reverse registration order. A bucket
  // holds one group's parameters of one dtype; every rank of a group has the
  // same parameters, so it builds the same buckets and launches them in order.
  // Under ZeRO a tied parameter's bucket holds only its tied module's
  // parameters, so every replica shards it alike; under ZeRO-3 a bucket holds
  // one unit's (module's) parameters, gathered and freed together.
  using Key = std::tuple<Communicator*, int, int, Communicator*, int>;  // group, dtypes, tied group, unit
  std::map<Key, std::pair<int, int64_t>> open;  // -> (bucket, bytes)
  for (size_t k = params_.size(); k-- > 0;) {
    SyncedParameter& sp = params_[k];
    const at::Tensor& t = sp.tensor;
    if (sp.grad_dtype == at::ScalarType::Undefined) sp.grad_dtype = t.scalar_type();
    Communicator* comm = sp.data_parallel && sp.data_parallel->size() > 1 ? sp.data_parallel : nullptr;
    const bool main = sp.grad_dtype != t.scalar_type();
    // Without a group the bucket is local: its flat buffer still makes the
    // step's zeroing one kernel instead of one per parameter.
    if (!t.requires_grad()) continue;
    const Key key(comm, static_cast<int>(t.scalar_type()), static_cast<int>(sp.grad_dtype),
                  zero_ > 0 ? sp.tied : nullptr, zero_ == 3 ? sp.unit : -1);
    auto it = open.find(key);
    if (it == open.end() || (overlap_ && zero_ < 3 && it->second.second >= bucket_bytes)) {
      buckets_.push_back(std::make_unique<Bucket>());
      buckets_.back()->comm = comm;
      buckets_.back()->main = main;
      it = open.insert_or_assign(key, std::make_pair(static_cast<int>(buckets_.size()) - 1, int64_t{0})).first;
    }
    buckets_[it->second.first]->params.push_back(k);
    bucket_of_[k] = it->second.first;
    it->second.second += t.numel() * static_cast<int64_t>(t.element_size());
  }
  for (auto& b : buckets_) {
    int64_t numel = 0;
    for (size_t k : b->params) numel += params_[k].tensor.numel();
    const int n = zero_ > 0 && b->comm ? b->comm->size() : 1;
    BucketLayout l;
    l.comm = b->comm;
    l.padded = (numel + n - 1) / n * n;
    l.shard = l.padded / n;
    l.rank = b->comm ? b->comm->rank() : 0;
    const SyncedParameter& first = params_[b->params.front()];
    l.unit = zero_ == 3 ? first.unit : -1;
    // Without ZeRO, a CPU bucket lives in memory its whole group maps where
    // the group has one (shared memory on one host): its all-reduce then
    // stages nothing, and a rank that finishes backward first reduces for one
    // still in it (Communicator::shared_buffer).
    if (zero_ == 0 && b->comm && first.tensor.device().is_cpu())
      b->flat = b->comm->shared_buffer(l.padded, first.grad_dtype);
    if (!b->flat.defined())
      b->flat = at::zeros({l.padded}, first.tensor.options().dtype(first.grad_dtype).requires_grad(false));
    // The reduced shard lives in the bucket's own slice, so ZeRO-2/3 hold no
    // second gradient buffer (the reduce-scatter's output must not alias its
    // input: it lands in a transient buffer first).
    if (zero_ > 0) b->shard = b->flat.narrow(0, l.rank * l.shard, l.shard);
    int64_t offset = 0;
    for (size_t k : b->params) {
      at::Tensor& t = params_[k].tensor;
      l.params.push_back(k);
      l.offsets.push_back(offset);
      l.numels.push_back(t.numel());
      at::Tensor view = b->flat.narrow(0, offset, t.numel()).view_as(t);
      if (t.grad().defined()) view.copy_(t.grad());
      if (b->main) {
        main_[k] = view;
        t.mutable_grad().reset();
      } else {
        t.mutable_grad() = view;
      }
      offset += t.numel();
    }
    if (zero_ > 0) layout_.push_back(std::move(l));
  }
  if (zero_ > 0) {
    segments_ = shard_segments(layout_);
    for (const ShardSegment& s : segments_)
      segment_grads_.push_back(buckets_[s.bucket]->shard.narrow(0, s.shard_begin, s.length));
  }
  // Unbucketed gradients exist from the start too, so that memory does not
  // grow in the first step (and backward accumulates in place from the first).
  for (size_t k = 0; k < params_.size(); ++k) {
    at::Tensor& t = params_[k].tensor;
    if (bucket_of_[k] < 0 && t.requires_grad() && !t.grad().defined())
      t.mutable_grad() = at::zeros_like(t).requires_grad_(false);
  }
  // A parameter's AccumulateGrad node lives only while something holds it (its
  // autograd meta keeps a weak pointer; each graph built from the parameter
  // holds it while that graph lives): keep it, or the next forward makes a new
  // node without the hook. DDP's reducer keeps its accumulators likewise.
  for (size_t k = 0; k < params_.size(); ++k)
    if (bucket_of_[k] >= 0 && (overlap_ || main_[k].defined() || zero_ == 3)) {
      std::shared_ptr<torch::autograd::Node> acc = torch::autograd::impl::grad_accumulator(params_[k].tensor);
      acc->add_post_hook(std::make_unique<Hook>(this, k));
      accumulators_.push_back(std::move(acc));
    }
}

GradientSync::~GradientSync() = default;

void GradientSync::begin_step() {
  std::fill(seen_.begin(), seen_.end(), 0);
  next_launch_ = 0;
  for (auto& b : buckets_) {
    b->pending = static_cast<int>(b->params.size());
    b->work.reset();
    b->flat.zero_();
  }
  // Zeroing in place keeps .grad the same tensor (bucket views alias it).
  for (size_t k = 0; k < params_.size(); ++k)
    if (bucket_of_[k] < 0 && params_[k].tensor.grad().defined()) params_[k].tensor.mutable_grad().zero_();
}

at::Tensor GradientSync::gradient(size_t k) const { return main_[k].defined() ? main_[k] : params_[k].tensor.grad(); }

void GradientSync::on_grad(size_t k) {
  if (bucket_of_[k] < 0) return;
  if (main_[k].defined()) {
    at::Tensor& g = params_[k].tensor.mutable_grad();
    if (g.defined()) {
      main_[k].add_(g);
      g.reset();
    }
  }
  if (zero_ == 3 && params_[k].unit >= 0 && unit_gradient_) unit_gradient_(params_[k].unit);
  if (!overlap_) return;
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
  if (!b.comm) return;  // main gradients of parameters without a data-parallel group
  if (!b.main)
    for (size_t k : b.params) check_view(k, b);
  if (zero_ >= 2 && b.comm->size() > 1) {
    b.incoming = at::empty_like(b.shard);
    b.work = b.comm->reduce_scatter(b.flat, b.incoming);
  } else {
    b.work = b.comm->allreduce(b.flat);
  }
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
  for (auto& b : buckets_) {
    if (b->work) b->work->wait();
    if (b->incoming.defined()) {
      b->shard.copy_(b->incoming);
      b->incoming = at::Tensor();
    }
  }
  std::vector<std::pair<const SyncedParameter*, at::Tensor>> grads;
  if (zero_ > 0) {
    // Each shard segment is summed over the same groups; every rank of those
    // groups lays its buckets out alike, so the segments line up.
    for (size_t i = 0; i < segments_.size(); ++i) grads.emplace_back(&params_[segments_[i].param], segment_grads_[i]);
  } else {
    for (size_t k = 0; k < params_.size(); ++k) {
      SyncedParameter& p = params_[k];
      if (!p.tensor.requires_grad()) continue;
      if (!main_[k].defined() && !p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
      grads.emplace_back(&p, gradient(k));
    }
  }
  reduce_beyond_data_parallel(grads);
}

namespace {

// One round of sums: per group in the order it first appears (every member
// rank lists its gradients in the same order), the gradients of one dtype and
// device go into one flat buffer, all groups' all-reduces are issued, then
// waited for, and the sums copied back.
void sum_in_buckets(const std::vector<std::pair<Communicator*, at::Tensor>>& items) {
  struct Group {
    Communicator* comm;
    at::ScalarType dtype;
    c10::Device device;
    std::vector<at::Tensor> tensors;
    at::Tensor flat;
    std::shared_ptr<Work> work;
  };
  std::vector<Group> groups;
  for (const auto& item : items) {
    Communicator* comm = item.first;
    const at::Tensor& t = item.second;
    if (!comm || comm->size() == 1 || t.numel() == 0) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& x) {
      return x.comm == comm && x.dtype == t.scalar_type() && x.device == t.device();
    });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{comm, t.scalar_type(), t.device(), {}, {}, {}});
    it->tensors.push_back(t);
  }
  for (Group& g : groups) {
    if (g.tensors.size() == 1 && g.tensors[0].is_contiguous()) {
      g.flat = g.tensors[0];  // summed in place
    } else {
      std::vector<at::Tensor> flat_parts;
      for (const at::Tensor& t : g.tensors) flat_parts.push_back(t.reshape(-1));
      g.flat = at::cat(flat_parts);
    }
    g.work = g.comm->allreduce(g.flat);
  }
  for (Group& g : groups) {
    g.work->wait();
    if (g.flat.is_same(g.tensors[0])) continue;
    int64_t offset = 0;
    for (at::Tensor& t : g.tensors) {
      t.copy_(g.flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace

// Partial-gradient axes first, one round per axis position (a sum over tp, say,
// must be complete before a later axis or the tied stages sum it further),
// then the stages holding a tied parameter: one collective per round, group
// and dtype, not one per parameter.
void GradientSync::reduce_beyond_data_parallel(const std::vector<std::pair<const SyncedParameter*, at::Tensor>>& grads) {
  size_t rounds = 0;
  for (const auto& [p, g] : grads) rounds = std::max(rounds, p->partial.size());
  std::vector<std::pair<Communicator*, at::Tensor>> items;
  for (size_t r = 0; r < rounds; ++r) {
    items.clear();
    for (const auto& [p, g] : grads)
      if (r < p->partial.size()) items.emplace_back(p->partial[r], g);
    sum_in_buckets(items);
  }
  items.clear();
  // SMP_TEST_FAULT=tied_missing_sum: each stage keeps its own part of a tied gradient.
  static const bool fault_tied = test_fault(TestFault::TiedMissingSum);
  for (const auto& [p, g] : grads)
    if (p->tied && !fault_tied) items.emplace_back(p->tied, g);
  sum_in_buckets(items);
}

int64_t GradientSync::bytes() const {
  int64_t total = 0;
  for (const auto& b : buckets_) total += b->flat.numel() * static_cast<int64_t>(b->flat.element_size());
  for (size_t k = 0; k < params_.size(); ++k) {
    const at::Tensor& g = params_[k].tensor.grad();
    if (bucket_of_[k] < 0 && g.defined()) total += g.numel() * static_cast<int64_t>(g.element_size());
  }
  return total;
}

}  // namespace smp
