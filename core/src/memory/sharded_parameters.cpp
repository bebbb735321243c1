#include "memory/sharded_parameters.h"

#include "base/test_faults.h"

#include <smp/error.h>

#include "comm/communicator.h"

#include <smp/common/init.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/StorageImpl.h>

#include <algorithm>

namespace smp {

namespace {

// Points p's storage at p.numel() elements of `flat` from `offset`; the
// storage's DataPtr holds a reference to `flat` until it is pointed elsewhere.
void alias_storage(const at::Tensor& p, const at::Tensor& flat, int64_t offset) {
  auto* holder = new at::Tensor(flat);
  void* data = static_cast<char*>(flat.data_ptr()) + offset * static_cast<int64_t>(flat.element_size());
  c10::StorageImpl* storage = p.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(
      c10::DataPtr(data, holder, [](void* ctx) { delete static_cast<at::Tensor*>(ctx); }, flat.device()));
  storage->set_nbytes(static_cast<size_t>(p.numel()) * p.element_size());
}

void empty_storage(const at::Tensor& p) {
  c10::StorageImpl* storage = p.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, p.device()));
  storage->set_nbytes(0);
}

// A parameter whose storage it shares with nothing else (a plugin may have
// made it a view of a larger tensor): the storage can then be re-pointed.
void own_storage(at::Tensor& p) {
  const auto bytes = static_cast<size_t>(p.numel()) * p.element_size();
  if (p.storage_offset() != 0 || !p.is_contiguous() || p.storage().nbytes() != bytes)
    p.set_data(p.detach().clone(at::MemoryFormat::Contiguous));
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

}  // namespace

std::vector<at::Tensor> cast_keeping_fp32(std::vector<at::Tensor>& params, at::ScalarType dtype) {
  c10::NoGradGuard no_grad;
  std::vector<at::Tensor> fp32(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& p = params[i];
    if (sdk::lacks_storage(p)) {
      p.set_data(sdk::detail::storageless(p.sizes(), p.options().dtype(dtype)));
      continue;
    }
    fp32[i] = p.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    if (p.is_floating_point() && p.scalar_type() != dtype) p.set_data(p.detach().to(dtype));
  }
  return fp32;
}

namespace {

// Stage 3: this rank's shard of bucket l in fp32, generated or copied part by
// part; nothing larger than the shard is made.
at::Tensor fp32_shard(const BucketLayout& l, const std::vector<at::Tensor>& params,
                      const std::vector<at::Tensor>& fp32_values,
                      const std::vector<std::shared_ptr<const sdk::InitSpec>>& inits) {
  const at::Tensor& first = params.at(l.params.front());
  at::Tensor shard = at::zeros({l.shard}, first.options().dtype(at::kFloat).requires_grad(false));
  const int64_t lo = l.rank * l.shard, hi = lo + l.shard;
  for (size_t j = 0; j < l.params.size(); ++j) {
    const size_t k = l.params[j];
    const int64_t a = std::max(lo, l.offsets[j]), b = std::min(hi, l.offsets[j] + l.numels[j]);
    if (a >= b) continue;
    at::Tensor dst = shard.narrow(0, a - lo, b - a);
    if (!inits.empty() && inits[k]) {
      if (dst.is_cpu()) {  // generated in place: nothing larger than the shard exists
        sdk::fill_init(*inits[k], a - l.offsets[j], b - a, dst.data_ptr<float>());
        continue;
      }
      at::Tensor part = at::empty({b - a}, at::kFloat);
      sdk::fill_init(*inits[k], a - l.offsets[j], b - a, part.data_ptr<float>());
      dst.copy_(part);
    } else {
      const at::Tensor& src = fp32_values.empty() ? params[k] : fp32_values.at(k);
      if (!src.defined() || sdk::lacks_storage(src))
        throw Error("ZeRO-3: parameter " + std::to_string(k) + " has neither values nor an initialiser");
      dst.copy_(src.detach().reshape(-1).narrow(0, a - l.offsets[j], b - a));
    }
  }
  return shard;
}

}  // namespace

struct ShardedParameters::Bucket {
  BucketLayout layout;
  at::Tensor full;    // the whole flat: stages 1-2 always, stage 3 while gathered
  at::Tensor local;   // this rank's shard in the compute dtype (a view of full under stages 1-2)
  at::Tensor master;  // its fp32 master under mixed precision, else undefined
  std::shared_ptr<Work> gathering;
  bool bound = false;  // the parameters point into full
};

ShardedParameters::ShardedParameters(std::vector<at::Tensor> params, const std::vector<at::Tensor>& fp32_values,
                                     std::vector<BucketLayout> layout, int stage, std::vector<std::string> units,
                                     const std::vector<std::shared_ptr<const sdk::InitSpec>>& inits)
    : params_(std::move(params)), stage_(stage) {
  c10::NoGradGuard no_grad;
  for (size_t u = 0; u < units.size(); ++u) unit_id_[units[u]] = static_cast<int>(u);
  buckets_of_unit_.resize(units.size());
  unit_params_.assign(units.size(), 0);
  unit_seen_.assign(units.size(), 0);
  for (auto& l : layout) {
    auto b = std::make_unique<Bucket>();
    const at::Tensor& first = params_.at(l.params.front());
    if (stage_ == 3) {
      // Only the shard: from the fp32 values (or generated), then the compute dtype.
      at::Tensor shard32 = fp32_shard(l, params_, fp32_values, inits);
      const bool mixed = first.scalar_type() != at::kFloat;
      if (mixed && fp32_values.empty() && inits.empty())
        throw Error("ZeRO: 16-bit parameters need their fp32 values for the masters");
      b->local = mixed ? shard32.to(first.scalar_type()) : shard32;
      if (mixed) b->master = shard32;
      for (size_t k : l.params) {
        if (!sdk::lacks_storage(params_[k])) own_storage(params_[k]);
        empty_storage(params_[k]);
      }
      if (l.unit >= 0) {
        buckets_of_unit_.at(l.unit).push_back(static_cast<int>(buckets_.size()));
        unit_params_.at(l.unit) += static_cast<int>(l.params.size());
      }
      b->layout = std::move(l);
      buckets_.push_back(std::move(b));
      continue;
    }
    for (size_t k : l.params)
      if (sdk::lacks_storage(params_[k])) throw Error("ZeRO-" + std::to_string(stage_) + ": deferred init is for stage 3 only");
    at::Tensor flat = at::zeros({l.padded}, first.options().requires_grad(false));
    at::Tensor flat32;
    if (!fp32_values.empty()) flat32 = at::zeros({l.padded}, flat.options().dtype(at::kFloat));
    for (size_t j = 0; j < l.params.size(); ++j) {
      const size_t k = l.params[j];
      flat.narrow(0, l.offsets[j], l.numels[j]).copy_(params_[k].detach().reshape(-1));
      if (flat32.defined()) flat32.narrow(0, l.offsets[j], l.numels[j]).copy_(fp32_values.at(k).detach().reshape(-1));
    }
    if (!flat32.defined() && flat.scalar_type() != at::kFloat)
      throw Error("ZeRO: 16-bit parameters need their fp32 values for the masters");
    if (flat32.defined()) b->master = flat32.narrow(0, l.rank * l.shard, l.shard).clone();
    for (size_t k : l.params) own_storage(params_[k]);
    b->full = flat;
    b->local = flat.narrow(0, l.rank * l.shard, l.shard);
    for (size_t j = 0; j < l.params.size(); ++j) alias_storage(params_[l.params[j]], b->full, l.offsets[j]);
    b->bound = true;
    b->layout = std::move(l);
    buckets_.push_back(std::move(b));
  }
  std::vector<BucketLayout> layouts;
  for (const auto& b : buckets_) layouts.push_back(b->layout);
  for (const ShardSegment& s : shard_segments(layouts)) {
    const Bucket& b = *buckets_[s.bucket];
    optimizer_params_.push_back((b.master.defined() ? b.master : b.local).narrow(0, s.shard_begin, s.length));
    parameter_segments_.push_back(b.local.narrow(0, s.shard_begin, s.length));
    has_masters_ = has_masters_ || b.master.defined();
  }
}

ShardedParameters::~ShardedParameters() {
  for (auto& b : buckets_)
    if (b->gathering) b->gathering->wait();
}

void ShardedParameters::after_step() {
  c10::NoGradGuard no_grad;
  for (auto& b : buckets_)
    if (b->master.defined()) b->local.copy_(b->master);
  if (stage_ < 3) {
    std::vector<std::pair<std::shared_ptr<Work>, at::Tensor>> works;
    for (auto& b : buckets_) {
      Communicator* c = b->layout.comm;
      if (!c || c->size() == 1) continue;
      at::Tensor in = b->local.clone();  // the input must not alias the output
      if (test_fault(TestFault::ZeroShardOffset)) {
        // One element off: rank 0's shard read from element 1, the others' from one before theirs.
        const BucketLayout& l = b->layout;
        in = b->full.narrow(0, l.rank * l.shard + (l.rank == 0 ? 1 : -1), l.shard).clone();
      }
      works.emplace_back(c->allgather(in, b->full), in);
    }
    for (auto& w : works) w.first->wait();
    return;
  }
  // Gathered copies are stale now: the next use gathers the updated shards.
  for (auto& b : buckets_) {
    if (b->gathering) {
      b->gathering->wait();
      b->gathering.reset();
    }
    if (b->bound) unbind(*b);
    b->full = at::Tensor();
  }
}

void ShardedParameters::start_gather(Bucket& b) {
  if (b.bound || b.gathering) return;
  Communicator* c = b.layout.comm;
  if (!c || c->size() == 1) {
    b.full = b.local;  // a shard of one is the whole bucket
    return;
  }
  b.full = at::empty({b.layout.padded}, b.local.options());
  b.gathering = c->allgather(b.local, b.full);
}

void ShardedParameters::bind(Bucket& b) {
  if (b.gathering) {
    b.gathering->wait();
    b.gathering.reset();
  }
  // SMP_TEST_FAULT=zero3_gather_offset: the gathered flat read one element off.
  if (test_fault(TestFault::Zero3GatherOffset) && b.layout.comm && b.layout.comm->size() > 1) b.full = b.full.roll(1);
  const BucketLayout& l = b.layout;
  for (size_t j = 0; j < l.params.size(); ++j) alias_storage(params_[l.params[j]], b.full, l.offsets[j]);
  b.bound = true;
}

void ShardedParameters::unbind(Bucket& b) {
  for (size_t k : b.layout.params) empty_storage(params_[k]);
  b.full = at::Tensor();
  b.bound = false;
}

void ShardedParameters::acquire(const std::string& unit) {
  if (stage_ < 3) return;
  auto it = unit_id_.find(unit);
  if (it == unit_id_.end()) return;
  const auto& ids = buckets_of_unit_[it->second];
  for (int i : ids) start_gather(*buckets_[i]);
  for (int i : ids)
    if (!buckets_[i]->bound) bind(*buckets_[i]);
}

void ShardedParameters::prefetch(const std::string& unit) {
  if (stage_ < 3) return;
  auto it = unit_id_.find(unit);
  if (it == unit_id_.end()) return;
  for (int i : buckets_of_unit_[it->second]) start_gather(*buckets_[i]);
}

void ShardedParameters::release(const std::string& unit) {
  auto it = unit_id_.find(unit);
  if (it != unit_id_.end()) release(it->second);
}

void ShardedParameters::release(int unit) {
  if (stage_ < 3 || unit < 0 || static_cast<size_t>(unit) >= buckets_of_unit_.size()) return;
  for (int i : buckets_of_unit_[unit])
    if (buckets_[i]->bound) unbind(*buckets_[i]);
}

void ShardedParameters::acquire_all() {
  for (const auto& [name, id] : unit_id_) acquire(name);
}

void ShardedParameters::release_all() {
  for (size_t unit = 0; unit < buckets_of_unit_.size(); ++unit) release(static_cast<int>(unit));
}

void ShardedParameters::begin_backward_pass() { std::fill(unit_seen_.begin(), unit_seen_.end(), 0); }

void ShardedParameters::gradient_arrived(int unit) {
  if (stage_ < 3 || unit < 0 || static_cast<size_t>(unit) >= unit_params_.size()) return;
  const auto u = static_cast<size_t>(unit);
  if (++unit_seen_[u] == unit_params_[u]) release(unit);
}

void ShardedParameters::end_backward_pass() {
  for (size_t u = 0; u < unit_seen_.size(); ++u)
    if (unit_seen_[u] > 0 && unit_seen_[u] < unit_params_[u]) release(static_cast<int>(u));
  begin_backward_pass();
}

int64_t ShardedParameters::parameter_bytes() const {
  int64_t total = 0;
  for (const auto& b : buckets_) {
    total += bytes_of(b->full);
    if (!b->full.defined() || !b->local.is_alias_of(b->full)) total += bytes_of(b->local);
  }
  return total;
}

int64_t ShardedParameters::master_bytes() const {
  int64_t total = 0;
  for (const auto& b : buckets_) total += bytes_of(b->master);
  return total;
}

}  // namespace smp
