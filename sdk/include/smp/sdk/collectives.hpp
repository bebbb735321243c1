// Collectives over a mesh axis, plain and autograd-aware (Megatron's f/g pairs).
#pragma once

#include <smp/sdk/host.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>
#include <vector>

namespace smp::sdk {

// An asynchronous collective in flight (owns the host's smp_event). wait()
// before reading the result; destroying an unwaited event waits first.
class Event {
 public:
  Event() = default;  // already complete (a group of one)
  explicit Event(smp_event* e) : e_(e) {}
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (e_) host().event_destroy(e_);
  }
  bool ready() const { return !e_ || host().event_ready(e_) != 0; }
  void wait() {
    if (e_) check(host().event_wait(e_));
  }

 private:
  smp_event* e_ = nullptr;
};

// A mesh axis' communicator as seen from a plugin. Borrowed from the host.
class Comm {
 public:
  Comm() = default;
  explicit Comm(smp_comm* c) : c_(c) {}
  smp_comm* get() const { return c_; }
  int rank() const { return c_ ? host().comm_rank(c_) : 0; }
  int size() const { return c_ ? host().comm_size(c_) : 1; }

  // In place. A non-contiguous t (e.g. a gradient coming out of a transpose) is reduced
  // through a contiguous copy: Gloo/NCCL need dense contiguous buffers.
  void allreduce(at::Tensor& t, smp_reduce_op op = SMP_REDUCE_SUM) const {
    if (size() == 1) return;
    if (!t.is_contiguous()) {
      at::Tensor c = t.contiguous();
      allreduce(c, op);
      t.copy_(c);
      return;
    }
    TensorRef h(t);
    check(host().comm_allreduce(c_, h.get(), op));
  }
  // Concatenation along dim 0 of every rank's tensor.
  at::Tensor allgather(const at::Tensor& in) const {
    if (size() == 1) return in;
    at::Tensor src = in.contiguous();
    auto sizes = src.sizes().vec();
    sizes[0] *= size();
    at::Tensor out = at::empty(sizes, src.options());
    TensorRef hi(src), ho(out);
    check(host().comm_allgather(c_, hi.get(), ho.get()));
    return out;
  }
  // This rank's dim-0 slice of the sum over ranks.
  at::Tensor reduce_scatter(const at::Tensor& in, smp_reduce_op op = SMP_REDUCE_SUM) const {
    if (size() == 1) return in;
    at::Tensor src = in.contiguous();
    auto sizes = src.sizes().vec();
    if (sizes[0] % size() != 0) throw Error("reduce_scatter: dim 0 not divisible by the group size");
    sizes[0] /= size();
    at::Tensor out = at::empty(sizes, src.options());
    TensorRef hi(src), ho(out);
    check(host().comm_reduce_scatter(c_, hi.get(), ho.get(), op));
    return out;
  }
  // Variable splits along dim 0; in_splits[r] rows go to rank r.
  at::Tensor alltoall(const at::Tensor& in, const std::vector<int64_t>& in_splits,
                      const std::vector<int64_t>& out_splits) const {
    at::Tensor out;
    alltoall_async(in, out, in_splits, out_splits).wait();
    return out;
  }

  // Asynchronous forms: start the collective, overlap compute, wait() the
  // event before touching the tensors. `t` / `in` must be contiguous.
  Event allreduce_async(at::Tensor& t, smp_reduce_op op = SMP_REDUCE_SUM) const {
    if (size() == 1) return Event();
    if (!t.is_contiguous()) throw Error("allreduce_async: the tensor must be contiguous");
    TensorRef h(t);
    smp_event* e = nullptr;
    check(host().comm_allreduce_async(c_, h.get(), op, &e));
    return Event(e);
  }
  // out is allocated here: sum(out_splits) rows shaped like in's.
  Event alltoall_async(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& in_splits,
                       const std::vector<int64_t>& out_splits) const {
    at::Tensor src = in.contiguous();
    const size_t n = static_cast<size_t>(size());
    if (in_splits.size() != n || out_splits.size() != n)
      throw Error("alltoall: " + std::to_string(in_splits.size()) + " input and " + std::to_string(out_splits.size()) +
                  " output splits for a group of " + std::to_string(n));
    int64_t in_rows = 0, rows = 0;
    for (auto s : in_splits) in_rows += s;
    for (auto s : out_splits) rows += s;
    if (in_rows != (src.dim() ? src.size(0) : 0))
      throw Error("alltoall: input splits add up to " + std::to_string(in_rows) + " rows, the tensor has " +
                  std::to_string(src.dim() ? src.size(0) : 0));
    auto sizes = src.sizes().vec();
    sizes[0] = rows;
    out = at::empty(sizes, src.options());
    if (n == 1) {
      out.copy_(src);
      return Event();
    }
    TensorRef hi(src), ho(out);
    smp_event* e = nullptr;
    check(host().comm_alltoall_async(c_, hi.get(), ho.get(), in_splits.data(), out_splits.data(), &e));
    return Event(e);
  }
  void broadcast(at::Tensor& t, int root) const {
    if (size() == 1) return;
    if (!t.is_contiguous()) {
      at::Tensor c = t.contiguous();
      broadcast(c, root);
      t.copy_(c);
      return;
    }
    TensorRef h(t);
    check(host().comm_broadcast(c_, h.get(), root));
  }

 private:
  smp_comm* c_ = nullptr;
};

namespace detail {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

inline at::Tensor split_along(const at::Tensor& x, int64_t dim, const Comm& comm) {
  int64_t n = x.size(dim);
  if (n % comm.size() != 0) throw Error("split: dimension size not divisible by the group size");
  return x.narrow(dim, comm.rank() * (n / comm.size()), n / comm.size()).contiguous();
}
inline at::Tensor gather_along(const at::Tensor& x, int64_t dim, const Comm& comm) {
  if (comm.size() == 1) return x;
  at::Tensor moved = x.transpose(0, dim).contiguous();
  return comm.allgather(moved).transpose(0, dim).contiguous();
}
inline at::Tensor reduce_scatter_along(const at::Tensor& x, int64_t dim, const Comm& comm) {
  if (comm.size() == 1) return x;
  at::Tensor moved = x.transpose(0, dim).contiguous();
  return comm.reduce_scatter(moved).transpose(0, dim).contiguous();
}
inline Comm comm_of(AutogradContext* ctx) {
  return Comm(reinterpret_cast<smp_comm*>(ctx->saved_data["comm"].toInt()));
}
inline void save(AutogradContext* ctx, const Comm& c, int64_t dim) {
  ctx->saved_data["comm"] = reinterpret_cast<int64_t>(c.get());
  ctx->saved_data["dim"] = dim;
}

// f: identity forward, all-reduce backward (enter a tensor-parallel region).
struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    ctx->saved_data["comm"] = comm;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    at::Tensor grad = g[0].clone();
    comm_of(ctx).allreduce(grad);
    return {grad, at::Tensor()};
  }
};
// g: all-reduce forward, identity backward (leave a tensor-parallel region).
struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm) {
    at::Tensor y = x.clone();
    Comm(reinterpret_cast<smp_comm*>(comm)).allreduce(y);
    return y;
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], at::Tensor()}; }
};
// Gather along dim forward, split backward.
struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, int64_t dim) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["dim"] = dim;
    return gather_along(x, dim, Comm(reinterpret_cast<smp_comm*>(comm)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {split_along(g[0], ctx->saved_data["dim"].toInt(), comm_of(ctx)), at::Tensor(), at::Tensor()};
  }
};
// Split along dim forward, gather backward.
struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, int64_t dim) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["dim"] = dim;
    return split_along(x, dim, Comm(reinterpret_cast<smp_comm*>(comm)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {gather_along(g[0], ctx->saved_data["dim"].toInt(), comm_of(ctx)), at::Tensor(), at::Tensor()};
  }
};
// Sequence parallelism: reduce-scatter along dim forward, all-gather backward.
struct ReduceScatterToSequence : torch::autograd::Function<ReduceScatterToSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, int64_t dim) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["dim"] = dim;
    return reduce_scatter_along(x, dim, Comm(reinterpret_cast<smp_comm*>(comm)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {gather_along(g[0], ctx->saved_data["dim"].toInt(), comm_of(ctx)), at::Tensor(), at::Tensor()};
  }
};
// All-to-all with uneven splits forward; the reverse all-to-all backward
// (MoE token dispatch / combine).
struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, std::vector<int64_t> in_splits,
                            std::vector<int64_t> out_splits) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["in_splits"] = in_splits;
    ctx->saved_data["out_splits"] = out_splits;
    return Comm(reinterpret_cast<smp_comm*>(comm)).alltoall(x, in_splits, out_splits);
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto in_splits = ctx->saved_data["in_splits"].toIntVector();
    auto out_splits = ctx->saved_data["out_splits"].toIntVector();
    return {comm_of(ctx).alltoall(g[0], out_splits, in_splits), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
// Sequence parallelism: all-gather along dim forward, reduce-scatter backward.
struct GatherFromSequence : torch::autograd::Function<GatherFromSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t comm, int64_t dim) {
    ctx->saved_data["comm"] = comm;
    ctx->saved_data["dim"] = dim;
    return gather_along(x, dim, Comm(reinterpret_cast<smp_comm*>(comm)));
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {reduce_scatter_along(g[0], ctx->saved_data["dim"].toInt(), comm_of(ctx)), at::Tensor(),
            at::Tensor()};
  }
};
}  // namespace detail

inline int64_t comm_id(const Comm& c) { return reinterpret_cast<int64_t>(c.get()); }

// Megatron's f: identity forward, all-reduce of the gradient backward.
inline at::Tensor copy_to_region(const at::Tensor& x, const Comm& c) {
  return c.size() == 1 ? x : detail::CopyToRegion::apply(x, comm_id(c));
}
// Megatron's g: all-reduce forward, identity backward.
inline at::Tensor reduce_from_region(const at::Tensor& x, const Comm& c) {
  return c.size() == 1 ? x : detail::ReduceFromRegion::apply(x, comm_id(c));
}
inline at::Tensor gather_from_region(const at::Tensor& x, const Comm& c, int64_t dim) {
  return c.size() == 1 ? x : detail::GatherFromRegion::apply(x, comm_id(c), dim);
}
inline at::Tensor scatter_to_region(const at::Tensor& x, const Comm& c, int64_t dim) {
  return c.size() == 1 ? x : detail::ScatterToRegion::apply(x, comm_id(c), dim);
}
inline at::Tensor reduce_scatter_to_sequence(const at::Tensor& x, const Comm& c, int64_t dim) {
  return c.size() == 1 ? x : detail::ReduceScatterToSequence::apply(x, comm_id(c), dim);
}
inline at::Tensor gather_from_sequence(const at::Tensor& x, const Comm& c, int64_t dim) {
  return c.size() == 1 ? x : detail::GatherFromSequence::apply(x, comm_id(c), dim);
}
// Rows [sum(in_splits[:r]), +in_splits[r]) of x go to rank r; the result holds
// out_splits[r] rows from each rank r, in rank order. Differentiable: the
// gradient goes back by the reverse all-to-all.
inline at::Tensor all_to_all(const at::Tensor& x, const Comm& c, const std::vector<int64_t>& in_splits,
                             const std::vector<int64_t>& out_splits) {
  return c.size() == 1 ? x : detail::AllToAll::apply(x, comm_id(c), in_splits, out_splits);
}

}  // namespace smp::sdk
