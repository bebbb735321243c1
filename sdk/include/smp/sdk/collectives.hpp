// Collectives over a mesh axis, plain and autograd-aware (Megatron's f/g pairs).
#pragma once

#include <smp/sdk/host.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace smp::sdk {

// The host's communication extension (ABI 2.4: point-to-point, asynchronous
// broadcast, completion modes, on-ready callbacks); throws naming what needs
// it when the host lacks it.
inline const smp_comm_extension& comm_extension(const char* what) {
  const auto* e =
      reinterpret_cast<const smp_comm_extension*>(find_extension(host().extension_start, SMP_EXTENSION_COMM));
  if (!e || e->base.struct_size < SMP_COMM_EXTENSION_STRUCT_SIZE)
    throw Error(std::string(what) + " needs the host's communication extension (SMP_EXTENSION_COMM, ABI 2.4)");
  return *e;
}

// An asynchronous collective in flight (owns the host's smp_event). wait()
// before reading the result; destroying an unwaited event waits first.
class Event {
 public:
  Event() = default;  // already complete (a group of one)
  explicit Event(smp_event* e) : e_(e) {}
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)), callback_(std::move(o.callback_)) {}
  Event& operator=(Event&& o) noexcept {
    std::swap(e_, o.e_);
    std::swap(callback_, o.callback_);
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (e_) host().event_destroy(e_);  // returns after an on-ready callback has run: then callback_ may go
  }
  bool ready() const { return !e_ || host().event_ready(e_) != 0; }
  void wait() {
    if (e_) check(host().event_wait(e_));
  }
  // With a completion mode (ABI 2.4): SMP_COMPLETION_HOST makes a device
  // result readable from the host; SMP_COMPLETION_STREAM orders the current stream.
  void wait(smp_completion_mode mode) {
    if (!e_) return;
    smp_event_wait_args a{};
    a.struct_size = SMP_EVENT_WAIT_ARGS_STRUCT_SIZE;
    a.event = e_;
    a.mode = mode;
    check(comm_extension("Event::wait(mode)").event_wait(&a));
  }
  // Runs f(error) once the operation has finished ("" = success), on a host
  // thread that is not the training thread: f must not block or communicate.
  // A complete event (a group of one) runs it here, now.
  void on_ready(std::function<void(const std::string& error)> f) {
    if (!e_) {
      f("");
      return;
    }
    if (callback_) throw Error("Event::on_ready: the event already has a callback");
    callback_ = std::make_unique<std::function<void(const std::string&)>>(std::move(f));
    smp_event_callback_args a{};
    a.struct_size = SMP_EVENT_CALLBACK_ARGS_STRUCT_SIZE;
    a.event = e_;
    a.callback = [](void* user, const smp_error* err) {
      (*static_cast<std::function<void(const std::string&)>*>(user))(err ? host().error_message(err) : "");
    };
    a.user = callback_.get();
    check(comm_extension("Event::on_ready").event_on_ready(&a));
  }

 private:
  smp_event* e_ = nullptr;
  std::unique_ptr<std::function<void(const std::string&)>> callback_;
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
  // Point-to-point (ABI 2.4's communication extension): `peer` is a rank in
  // this group; a send and a recv match by the pair and `tag`. recv writes t,
  // which has the sender's shape and dtype. The tensors must be contiguous.
  Event send_async(const at::Tensor& t, int peer, int tag = 0) const { return p2p(true, t, peer, tag, true); }
  Event recv_async(at::Tensor& t, int peer, int tag = 0) const { return p2p(false, t, peer, tag, true); }
  void send(const at::Tensor& t, int peer, int tag = 0) const { p2p(true, t, peer, tag, false); }
  void recv(at::Tensor& t, int peer, int tag = 0) const { p2p(false, t, peer, tag, false); }
  // Root's t on every rank, in place, asynchronously (ABI 2.4).
  Event broadcast_async(at::Tensor& t, int root) const {
    if (size() == 1) return Event();
    if (!t.is_contiguous()) throw Error("broadcast_async: the tensor must be contiguous");
    TensorRef h(t);
    smp_event* e = nullptr;
    smp_broadcast_args a{};
    a.struct_size = SMP_BROADCAST_ARGS_STRUCT_SIZE;
    a.comm = c_;
    a.inout = h.get();
    a.root = root;
    a.event = &e;
    check(comm_extension("Comm::broadcast_async").broadcast(&a));
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
  Event p2p(bool send, const at::Tensor& t, int peer, int tag, bool async) const {
    const char* what = send ? "Comm::send" : "Comm::recv";
    if (!t.is_contiguous()) throw Error(std::string(what) + ": the tensor must be contiguous");
    TensorRef h(t);
    smp_event* e = nullptr;
    smp_p2p_args a{};
    a.struct_size = SMP_P2P_ARGS_STRUCT_SIZE;
    a.comm = c_;
    a.tensor = h.get();
    a.peer = peer;
    a.tag = tag;
    a.event = async ? &e : nullptr;
    const smp_comm_extension& ext = comm_extension(what);
    check(send ? ext.send(&a) : ext.recv(&a));
    return Event(e);
  }
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
