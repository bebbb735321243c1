// smp::Communicator over c10d (via c10d_compat), and the job's Rendezvous.
//
// Analytic byte accounting (CommStats::analytic[op]): the bytes THIS rank sends
// for the op under the standard algorithm, as exact integers. n = group size, r = group
// rank, B = the tensor's bytes (numel * element size). Groups of one send 0.
//   allreduce       ring (reduce-scatter then allgather) over n chunks split
//                   like torch.tensor_split (the first numel % n chunks one
//                   element longer): rank r sends every chunk but (r+1)%n in
//                   the first phase and every chunk but (r+2)%n in the second:
//                   2*B - chunk[(r+1)%n] - chunk[(r+2)%n]. That is exactly
//                   2*(n-1)/n * B when numel % n == 0, and sums to 2*(n-1)*B
//                   over the group in every case.
//   allgather       (n-1) * B_in (its block to every other rank).
//   reduce_scatter  B_in - B_out: every slice of its input but its own (what a
//                   direct / ring reduce-scatter sends); = (n-1)/n * B_in when even.
//   alltoall        the rows it sends to other ranks: sum over j != r of
//                   in_splits[j] * row bytes.
//   broadcast       a binomial tree (what Gloo runs): with v = (r - root) mod n,
//                   in round k the ranks v < 2^k send to v + 2^k (when < n):
//                   B per such round; (n-1) B over the group.
//   send            B.   recv, barrier: 0.
// CommStats::calls[op] counts calls (groups of one included). Analytic bytes
// are counted when the op is submitted, whether or not it then succeeds.
//
// Measured bytes (CommStats::sent[transport][op]) are counted by the transport
// that moved them: shared memory counts its copies into shared memory (see
// ShmCollectives::bytes_written; a one-host all-reduce writes each byte once,
// not a ring's 2(n-1)/n); Gloo's are the kernel's count of what this rank
// wrote into the group's sockets, read when a Gloo op is submitted and when
// stats() is read, and given to the Gloo ops in flight in between. NCCL keeps
// no count we can read: its calls are tallied in uncounted_calls.
//
// reduce_scatter: Gloo (LibTorch 1.13) has none, so it is an alltoall of the
// slices followed by a local reduction of the n received slices (same bytes on
// the wire as a direct reduce-scatter). Slices follow torch.tensor_split: with
// N rows and n ranks, rank i gets N/n rows plus one when i < N % n; `out` must
// have that many rows. NCCL's native reduce-scatter is used when it applies
// (CUDA, even split).
#include "comm/communicator.h"

#include <smp/error.h>

#include "comm/c10d_compat.h"
#include "comm/comm_handle.h"
#include "comm/shm_collectives.h"
#include "comm/shm_mailbox.h"
#include "base/trace.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

namespace smp {

int64_t CommStats::total_analytic() const {
  int64_t t = 0;
  for (const auto& [op, b] : analytic) t += b;
  return t;
}

namespace {

std::string join(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::string shape(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Rows of slice i when `rows` rows are split n ways (torch.tensor_split).
int64_t split_rows(int64_t rows, int n, int i) { return rows / n + (i < rows % n ? 1 : 0); }

// The bytes rank r sends in a ring allreduce (see the top of the file).
int64_t ring_allreduce_bytes(int64_t numel, int64_t esize, int n, int r) {
  if (n <= 1) return 0;
  auto chunk = [&](int i) { return split_rows(numel, n, i) * esize; };
  return 2 * numel * esize - chunk((r + 1) % n) - chunk((r + 2) % n);
}

// The bytes rank r sends in a binomial-tree broadcast from `root`.
int64_t tree_broadcast_bytes(int64_t bytes, int n, int r, int root) {
  const int v = (r - root + n) % n;
  int sends = 0;
  for (int64_t step = 1; step < n; step <<= 1)
    if (v < step && v + step < n) ++sends;
  return sends * bytes;
}

// Who we are, for messages; copied into every Work so it outlives nothing.
struct Context {
  std::string axis, name;
  std::vector<int> ranks;
  int rank = 0;
  int64_t timeout_ms = 0;

  std::string where(const std::string& op) const {
    return "communication error: " + op + " on axis '" + axis + "' (group '" + name + "', world ranks " +
           join(ranks) + ", this process is group rank " + std::to_string(rank) + " = world rank " +
           std::to_string(ranks[rank]) + ")";
  }
  Error failure(const std::string& op, const c10d_compat::Failure& f) const {
    std::string m = where(op) + " failed";
    if (f.timed_out()) m += " (timed out; timeout " + std::to_string(timeout_ms) + " ms)";
    return Error(m + ": " + f.what());
  }
  Error invalid(const std::string& op, const std::string& what) const {
    return Error("invalid " + op + " on axis '" + axis + "' (group '" + name + "', world ranks " + join(ranks) +
                 "): " + what);
  }
};

// What a trace shows of an operation: its kind ("allreduce"), axis and bytes,
// and when it was issued (-1: not traced).
struct TraceTag {
  std::string kind;
  int64_t bytes = 0;
  int64_t issued_us = -1;
};

class CommWork final : public Work {
 public:
  CommWork(std::shared_ptr<const Context> ctx, std::string op, std::shared_ptr<c10d_compat::PendingWork> inner,
           std::function<void()> finish, TraceTag tag = {})
      : ctx_(std::move(ctx)), op_(std::move(op)), inner_(std::move(inner)), finish_(std::move(finish)),
        tag_(std::move(tag)) {}

  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      done_ = true;
      const int64_t wait_start = tag_.issued_us >= 0 ? trace::now_us() : -1;
      struct Traced {  // records the wait and the operation's life once it completed
        const TraceTag& tag;
        const std::string& axis;
        int64_t wait_start;
        ~Traced() {
          if (wait_start < 0) return;
          const int64_t end = trace::now_us();
          const trace::Args args{{"axis", axis}, {"bytes", static_cast<double>(tag.bytes)}};
          trace::async_slice("comm", tag.kind + " " + axis, tag.issued_us, end, args);
          if (end - wait_start >= 1) trace::complete("wait", "wait " + tag.kind + " " + axis, wait_start, end, args);
        }
      } traced{tag_, ctx_->axis, wait_start};
      try {
        if (inner_) inner_->wait();
        if (finish_) finish_();
      } catch (const c10d_compat::Failure& f) {
        error_ = std::make_exception_ptr(ctx_->failure(op_, f));
      } catch (const Error&) {
        error_ = std::current_exception();
      } catch (const c10::Error& e) {
        error_ = std::make_exception_ptr(Error(ctx_->where(op_) + " failed: " + e.what_without_backtrace()));
      } catch (const std::exception& e) {
        error_ = std::make_exception_ptr(Error(ctx_->where(op_) + " failed: " + e.what()));
      }
      inner_.reset();
      finish_ = nullptr;
    }
    if (error_) std::rethrow_exception(error_);
  }

  bool ready() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || !inner_) return true;
    try {
      return inner_->ready();
    } catch (...) {
      return true;  // wait() reports the failure
    }
  }

 private:
  std::shared_ptr<const Context> ctx_;
  std::string op_;
  std::shared_ptr<c10d_compat::PendingWork> inner_;
  std::function<void()> finish_;
  TraceTag tag_;
  std::mutex mu_;
  bool done_ = false;
  std::exception_ptr error_;
};

// An operation run on host copies of CUDA tensors: once it completed, `then`
// copies the result back to the device.
class ThenWork final : public Work {
 public:
  ThenWork(std::shared_ptr<Work> inner, std::function<void()> then) : inner_(std::move(inner)), then_(std::move(then)) {}
  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    inner_->wait();
    if (then_) {
      auto f = std::move(then_);
      then_ = nullptr;
      f();
    }
  }
  bool ready() override { return inner_->ready(); }

 private:
  std::shared_ptr<Work> inner_;
  std::function<void()> then_;
  std::mutex mu_;
};

// A dense contiguous tensor to hand to c10d; `copy_back` when it's a copy.
struct Staged {
  at::Tensor t;
  bool copied = false;
};
Staged stage(const at::Tensor& t) {
  if (t.is_contiguous()) return {t, false};
  return {t.contiguous(), true};
}

// What an op does once it completed: copy the staged result back into the
// caller's tensor when staging made a copy; the captures keep the staged
// tensors (and keep_alive, the staged input) alive until then.
std::function<void()> write_back(at::Tensor target, const Staged& result, at::Tensor keep_alive = {}) {
  return [target, src = result.t, copied = result.copied, keep = std::move(keep_alive)]() mutable {
    if (copied) target.copy_(src);
  };
}

class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(std::shared_ptr<const Context> ctx, std::unique_ptr<c10d_compat::Backend> backend,
                   std::unique_ptr<c10d_compat::Backend> nccl, std::unique_ptr<ShmCollectives> shm,
                   std::unique_ptr<ShmMailbox> mailbox)
      : ctx_(std::move(ctx)), backend_(std::move(backend)), nccl_(std::move(nccl)), shm_(std::move(shm)),
        mailbox_(std::move(mailbox)), handle_{this}, gloo_counted_(backend_ && backend_->bytes_written() >= 0) {}

  const std::string& axis() const override { return ctx_->axis; }
  int rank() const override { return ctx_->rank; }
  int size() const override { return static_cast<int>(ctx_->ranks.size()); }
  const std::vector<int>& global_ranks() const override { return ctx_->ranks; }
  CommStats stats() const override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    settle_gloo();
    CommStats out = stats_;
    if (shm_) {
      for (auto [kind, op] : kShmKinds) {
        const int64_t b = shm_->bytes_written(kind) - shm_base_[kind];
        if (b > 0) out.sent["shm"][op] += b;
      }
    }
    if (mailbox_) {
      const int64_t b = mailbox_->bytes_written() - mailbox_base_;
      if (b > 0) out.sent["shm"]["send"] += b;
    }
    return out;
  }
  void reset_stats() override {
    std::lock_guard<std::mutex> lock(stats_mu_);
    settle_gloo();
    stats_ = CommStats{};
    if (shm_)
      for (auto [kind, op] : kShmKinds) shm_base_[kind] = shm_->bytes_written(kind);
    if (mailbox_) mailbox_base_ = mailbox_->bytes_written();
  }
  smp_comm* handle() override { return &handle_; }

  std::string transport(const std::string& op, const c10::Device& device) const override {
    if (!backend_) return "local";
    if (device.is_cuda()) {
      if (nccl_) return nccl_->name();
      return transport(op, c10::Device(c10::kCPU)) + " (through host memory)";
    }
    if ((op == "allreduce" || op == "allgather" || op == "reduce_scatter" || op == "alltoall") && via_shm(device))
      return "shm";
    if ((op == "send" || op == "recv") && mailbox_ && device.is_cpu()) return "shm";
    return backend_->name();
  }

  std::shared_ptr<Work> allreduce(at::Tensor& t, ReduceOp op) override {
    const std::string name = std::string("allreduce(") + to_string(op) + ")";
    check_dense(name, t, "tensor");
    if (via_host(t)) {
      at::Tensor h = t.cpu();
      return then(allreduce(h, op), [t, h]() mutable { t.copy_(h); });
    }
    const int n = size();
    count("allreduce", ring_allreduce_bytes(t.numel(), t.element_size(), n, rank()));
    if (n == 1 || t.numel() == 0) return done(name);
    if (via_shm(t.device())) {
      const int index = shm_->shared_buffer_index(t);
      if (index >= 0) return submit(name, [&] { return shm_->allreduce_shared(index, op); }, [] {});
      Staged s = stage(t);
      return submit(name, [&] { return shm_->allreduce(s.t, op); }, write_back(t, s));
    }
    Staged s = stage(t);
    return submit(name, [&] { return backend_for(t).allreduce(s.t, op); }, write_back(t, s), &backend_for(t));
  }

  at::Tensor shared_buffer(int64_t numel, at::ScalarType dtype) override {
    if (!shm_ || size() == 1) return {};
    try {
      return shm_->shared_buffer(numel, dtype);
    } catch (const c10d_compat::Failure& f) {
      throw ctx_->failure("shared_buffer", f);
    }
  }

  std::shared_ptr<Work> allgather(const at::Tensor& in, at::Tensor& out) override {
    const char* name = "allgather";
    check_dense(name, in, "in");
    check_dense(name, out, "out");
    const int n = size();
    check_same_kind(name, in, out);
    if (via_host(in)) {
      at::Tensor hin = in.cpu(), hout = at::empty(out.sizes(), out.options().device(c10::kCPU));
      return then(allgather(hin, hout), [out, hout, hin]() mutable { out.copy_(hout); });
    }
    auto want = in.sizes().vec();
    if (want.empty()) throw ctx_->invalid(name, "in must have at least one dimension (gathered along dim 0)");
    want[0] *= n;
    if (out.sizes().vec() != want)
      throw ctx_->invalid(name, "out has shape " + shape(out) + ", expected " + shape(at::empty(want, at::kByte)) +
                                    " (in " + shape(in) + " times " + std::to_string(n) + " ranks along dim 0)");
    count(name, (n - 1) * nbytes(in));
    if (n == 1) {
      out.copy_(in);
      return done(name);
    }
    if (in.numel() == 0) return done(name);
    Staged si = stage(in), so = stage(out);
    if (via_shm(in.device())) return submit(name, [&] { return shm_->allgather(si.t, so.t); }, write_back(out, so, si.t));
    return submit(name, [&] { return backend_for(in).allgather(si.t, so.t); }, write_back(out, so, si.t),
                  &backend_for(in));
  }

  std::shared_ptr<Work> reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    const std::string name = std::string("reduce_scatter(") + to_string(op) + ")";
    check_dense(name, in, "in");
    check_dense(name, out, "out");
    check_same_kind(name, in, out);
    if (via_host(in)) {
      at::Tensor hin = in.cpu(), hout = at::empty(out.sizes(), out.options().device(c10::kCPU));
      return then(reduce_scatter(hin, hout, op), [out, hout, hin]() mutable { out.copy_(hout); });
    }
    const int n = size(), r = rank();
    if (in.dim() == 0) throw ctx_->invalid(name, "in must have at least one dimension (scattered along dim 0)");
    const int64_t rows = in.size(0);
    auto want = in.sizes().vec();
    want[0] = split_rows(rows, n, r);
    if (out.sizes().vec() != want)
      throw ctx_->invalid(name, "out has shape " + shape(out) + ", expected " + shape(at::empty(want, at::kByte)) +
                                    " (group rank " + std::to_string(r) + "'s slice of " + std::to_string(rows) +
                                    " rows split " + std::to_string(n) + " ways like torch.tensor_split)");
    count("reduce_scatter", nbytes(in) - nbytes(out));
    if (n == 1) {
      out.copy_(in);
      return done(name);
    }
    if (in.numel() == 0) return done(name);
    Staged si = stage(in);
    if (in.is_cuda() && nccl_ && nccl_->has_reduce_scatter() && rows % n == 0) {
      Staged so = stage(out);
      return submit(name, [&] { return nccl_->reduce_scatter(si.t, so.t, op); }, write_back(out, so, si.t), nccl_.get());
    }
    if (via_shm(in.device())) {
      Staged so = stage(out);
      const int64_t row = rows > 0 ? in.numel() / rows : 0;
      std::vector<int64_t> counts(n);
      for (int i = 0; i < n; ++i) counts[i] = split_rows(rows, n, i) * row;
      return submit(name, [&] { return shm_->reduce_scatter(si.t, so.t, counts, op); }, write_back(out, so, si.t));
    }
    // alltoall of the slices, then reduce the n slices received.
    std::vector<int64_t> in_splits(n), out_splits(n, want[0]);
    for (int i = 0; i < n; ++i) in_splits[i] = split_rows(rows, n, i);
    auto recv_sizes = want;
    recv_sizes[0] = want[0] * n;
    at::Tensor recv = at::empty(recv_sizes, in.options());
    at::Tensor target = out;
    c10d_compat::Backend* via = &backend_for(in);
    return submit(name, [&] { return via->alltoall(si.t, recv, in_splits, out_splits); },
                  [target, recv, n, op, keep = si.t]() mutable {
                    auto parts_shape = target.sizes().vec();
                    parts_shape.insert(parts_shape.begin(), n);
                    at::Tensor parts = recv.view(parts_shape);
                    switch (op) {
                      case ReduceOp::Sum: target.copy_(parts.sum(0)); break;
                      case ReduceOp::Max: target.copy_(std::get<0>(parts.max(0))); break;
                      case ReduceOp::Min: target.copy_(std::get<0>(parts.min(0))); break;
                      case ReduceOp::Product: target.copy_(parts.prod(0)); break;
                    }
                  },
                  via);
  }

  std::shared_ptr<Work> alltoall(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& in_splits_arg,
                                 const std::vector<int64_t>& out_splits_arg) override {
    const char* name = "alltoall";
    check_dense(name, in, "in");
    check_dense(name, out, "out");
    check_same_kind(name, in, out);
    if (via_host(in)) {
      at::Tensor hin = in.cpu(), hout = at::empty(out.sizes(), out.options().device(c10::kCPU));
      return then(alltoall(hin, hout, in_splits_arg, out_splits_arg), [out, hout, hin]() mutable { out.copy_(hout); });
    }
    const int n = size(), r = rank();
    if (in.dim() == 0 || out.dim() == 0) throw ctx_->invalid(name, "in and out must have at least one dimension");
    if (in.sizes().slice(1) != out.sizes().slice(1))
      throw ctx_->invalid(name, "in " + shape(in) + " and out " + shape(out) + " differ beyond dim 0");
    auto splits = [&](const std::vector<int64_t>& given, const at::Tensor& t, const char* which) {
      std::vector<int64_t> s = given;
      if (s.empty()) {
        if (t.size(0) % n != 0)
          throw ctx_->invalid(name, std::string(which) + " has " + std::to_string(t.size(0)) +
                                        " rows, not divisible by the group size " + std::to_string(n) +
                                        " (give explicit splits)");
        s.assign(n, t.size(0) / n);
      }
      if (static_cast<int>(s.size()) != n)
        throw ctx_->invalid(name, std::string(which) + "_splits has " + std::to_string(s.size()) +
                                      " entries for a group of " + std::to_string(n));
      int64_t sum = 0;
      for (auto x : s) {
        if (x < 0) throw ctx_->invalid(name, std::string(which) + "_splits has a negative entry");
        sum += x;
      }
      if (sum != t.size(0))
        throw ctx_->invalid(name, std::string(which) + "_splits sum to " + std::to_string(sum) + " but " + which +
                                      " has " + std::to_string(t.size(0)) + " rows");
      return s;
    };
    std::vector<int64_t> is = splits(in_splits_arg, in, "in"), os = splits(out_splits_arg, out, "out");
    const int64_t row_bytes = in.size(0) ? nbytes(in) / in.size(0) : 0;
    int64_t sent = 0;
    for (int j = 0; j < n; ++j)
      if (j != r) sent += is[j] * row_bytes;
    count(name, sent);
    if (n == 1) {
      out.copy_(in);
      return done(name);
    }
    Staged si = stage(in), so = stage(out);
    // Moving rows needs no arithmetic: bf16 travels as bytes (a row of h
    // values as 2h), which every backend has (Gloo of LibTorch 1.13 has no bf16).
    auto bits = [](const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? t.view(at::kByte) : t; };
    if (via_shm(in.device())) {
      // Slices in elements of the (byte-viewed) tensors.
      const at::Tensor i = bits(si.t), o = bits(so.t);
      const int64_t row = c10::multiply_integers(i.sizes().slice(1));
      std::vector<int64_t> ic(is), oc(os);
      for (auto& x : ic) x *= row;
      for (auto& x : oc) x *= row;
      return submit(name, [&] { return shm_->alltoall(i, o, ic, oc); }, write_back(out, so, si.t));
    }
    return submit(name,
                  [&] {
                    at::Tensor i = bits(si.t), o = bits(so.t);
                    return backend_for(in).alltoall(i, o, is, os);
                  },
                  write_back(out, so, si.t), &backend_for(in));
  }

  std::shared_ptr<Work> broadcast(at::Tensor& t, int root) override {
    const std::string name = "broadcast(root " + std::to_string(root) + ")";
    check_dense(name, t, "tensor");
    if (via_host(t)) {
      at::Tensor h = t.cpu();
      return then(broadcast(h, root), [t, h]() mutable { t.copy_(h); });
    }
    const int n = size();
    if (root < 0 || root >= n)
      throw ctx_->invalid(name, "root " + std::to_string(root) + " is not a group rank (size " + std::to_string(n) + ")");
    count("broadcast", tree_broadcast_bytes(nbytes(t), n, rank(), root));
    if (n == 1 || t.numel() == 0) return done(name);
    Staged s = stage(t);
    return submit(name, [&] { return backend_for(t).broadcast(s.t, root); }, write_back(t, s), &backend_for(t));
  }

  std::shared_ptr<Work> send(const at::Tensor& t, int peer, int tag) override {
    const std::string name = "send(to group rank " + std::to_string(peer) + ", tag " + std::to_string(tag) + ")";
    check_dense(name, t, "tensor");
    check_peer(name, peer, tag);
    if (via_host(t)) return send(t.cpu(), peer, tag);
    count("send", nbytes(t));
    Staged s = stage(t);
    if (mailbox_ && t.is_cpu()) {
      // A message the mailbox has no room for goes through Gloo: tracked then.
      bool through_backend = false;
      return submit(name, [&] { return mailbox_->send(s.t, peer, tag, *backend_, &through_backend); },
                    [keep = s.t] {}, nullptr, &through_backend);
    }
    return submit(name, [&] { return backend_for(t).send(s.t, peer, tag); }, [keep = s.t] {}, &backend_for(t));
  }

  std::shared_ptr<Work> recv(at::Tensor& t, int peer, int tag) override {
    const std::string name = "recv(from group rank " + std::to_string(peer) + ", tag " + std::to_string(tag) + ")";
    check_dense(name, t, "tensor");
    check_peer(name, peer, tag);
    if (via_host(t)) {
      at::Tensor h = at::empty(t.sizes(), t.options().device(c10::kCPU));
      return then(recv(h, peer, tag), [t, h]() mutable { t.copy_(h); });
    }
    count("recv", 0);
    Staged s = stage(t);
    if (mailbox_ && t.is_cpu())
      return submit(name, [&] { return mailbox_->recv(s.t, peer, tag, *backend_); }, write_back(t, s));
    return submit(name, [&] { return backend_for(t).recv(s.t, peer, tag); }, write_back(t, s));
  }

  void barrier() override {
    count("barrier", 0);
    if (size() == 1) return;
    submit("barrier", [&] { return backend_->barrier(); }, nullptr, backend_.get())->wait();
  }

 private:
  // What count() noted of the operation this thread is issuing, read by the
  // submit() or done() of the same call. Per thread: the training thread and
  // helper threads (a checkpoint snapshot, a watcher) may issue on one
  // communicator at once, and neither may take the other's name or trace tag.
  struct Issuing {
    std::string op;
    TraceTag tag;
  };
  static Issuing& issuing() {
    thread_local Issuing current;
    return current;
  }

  void count(const std::string& op, int64_t bytes) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.analytic[op] += bytes;
    stats_.calls[op] += 1;
    // The operation this thread submits next is this one.
    issuing() = {op, trace::active() ? TraceTag{op, bytes, trace::now_us()} : TraceTag{}};
  }

  std::shared_ptr<Work> done(const std::string& op) {
    issuing().tag = {};  // nothing to trace: a group of one, or an empty tensor
    return std::make_shared<CommWork>(ctx_, op, nullptr, nullptr);
  }

  // `via`: the c10d backend the op goes through (null: shared memory), whose
  // bytes are counted for it (Gloo) or whose call is tallied as uncounted (NCCL).
  // `fell_back`, set by submit_fn: the mailbox sent the message through Gloo.
  template <class Submit>
  std::shared_ptr<Work> submit(const std::string& op, Submit&& submit_fn, std::function<void()> finish,
                               c10d_compat::Backend* via = nullptr, const bool* fell_back = nullptr) {
    const bool gloo = via && via == backend_.get() && gloo_counted_;
    if (via && !gloo) {
      std::lock_guard<std::mutex> lock(stats_mu_);
      stats_.uncounted_calls[via->name()][issuing().op] += 1;
    } else if (gloo) {
      // Bytes written so far belong to the ops already in flight (or, with
      // none, to "unattributed"), not to this one.
      std::lock_guard<std::mutex> lock(stats_mu_);
      settle_gloo();
    }
    std::shared_ptr<c10d_compat::PendingWork> pending;
    try {
      pending = submit_fn();
    } catch (const c10d_compat::Failure& f) {
      throw ctx_->failure(op, f);
    }
    if (pending && (gloo || (fell_back && *fell_back && gloo_counted_))) {
      std::lock_guard<std::mutex> lock(stats_mu_);
      gloo_inflight_.push_back({issuing().op, pending});
    }
    return std::make_shared<CommWork>(ctx_, op, std::move(pending), std::move(finish), std::exchange(issuing().tag, {}));
  }

  // Gives the bytes written into Gloo's sockets since the last reading to the
  // ops in flight since then, and forgets those that have completed (checked
  // before the reading, so their last bytes are in it). Under stats_mu_.
  void settle_gloo() const {
    if (!gloo_counted_) return;
    std::vector<bool> finished;
    for (const auto& f : gloo_inflight_) finished.push_back(f.work->ready());
    const int64_t now = backend_->bytes_written();
    if (now > gloo_seen_) {
      std::set<std::string> names;
      for (const auto& f : gloo_inflight_) names.insert(f.op);
      std::string key;
      for (const auto& n : names) key += (key.empty() ? "" : "+") + n;
      stats_.sent["gloo"][key.empty() ? "unattributed" : key] += now - gloo_seen_;
      gloo_seen_ = now;
    }
    size_t k = 0;
    for (size_t i = 0; i < gloo_inflight_.size(); ++i)
      if (!finished[i]) gloo_inflight_[k++] = gloo_inflight_[i];
    gloo_inflight_.resize(k);
  }

  // The one rule for all-reduce, all-gather and reduce-scatter (and for transport()).
  bool via_shm(const c10::Device& device) const { return shm_ && device.is_cpu(); }
  // CUDA tensors without NCCL go through host copies and the CPU path.
  bool via_host(const at::Tensor& t) const { return t.is_cuda() && !nccl_ && size() > 1; }
  c10d_compat::Backend& backend_for(const at::Tensor& t) { return t.is_cuda() && nccl_ ? *nccl_ : *backend_; }
  static std::shared_ptr<Work> then(std::shared_ptr<Work> inner, std::function<void()> f) {
    return std::make_shared<ThenWork>(std::move(inner), std::move(f));
  }

  void check_dense(const std::string& op, const at::Tensor& t, const char* what) const {
    if (!t.defined()) throw ctx_->invalid(op, std::string(what) + " is an undefined tensor");
    if (t.layout() != at::kStrided) throw ctx_->invalid(op, std::string(what) + " is not a dense (strided) tensor");
  }
  void check_same_kind(const std::string& op, const at::Tensor& a, const at::Tensor& b) const {
    if (a.scalar_type() != b.scalar_type() || a.device() != b.device())
      throw ctx_->invalid(op, std::string("in (") + c10::toString(a.scalar_type()) + ", " + a.device().str() +
                                  ") and out (" + c10::toString(b.scalar_type()) + ", " + b.device().str() +
                                  ") differ in dtype or device");
  }
  void check_peer(const std::string& op, int peer, int tag) const {
    if (peer < 0 || peer >= size() || peer == rank())
      throw ctx_->invalid(op, "peer " + std::to_string(peer) + " is not another group rank (this is " +
                                  std::to_string(rank()) + " of " + std::to_string(size()) + ")");
    if (tag < 0) throw ctx_->invalid(op, "tag must be >= 0");
  }

  std::shared_ptr<const Context> ctx_;
  std::unique_ptr<c10d_compat::Backend> backend_;  // Gloo; null for groups of one
  std::unique_ptr<c10d_compat::Backend> nccl_;     // NCCL for CUDA tensors; null: through host memory
  std::unique_ptr<ShmCollectives> shm_;              // null unless every member is on this host
  std::unique_ptr<ShmMailbox> mailbox_;              // CPU send/recv; null with shm_
  smp_comm handle_;
  // Byte accounting (stats() is const: it settles Gloo's count first).
  struct GlooOp {
    std::string op;
    std::shared_ptr<c10d_compat::PendingWork> work;  // its ready() never blocks
  };
  static constexpr std::pair<ShmCollectives::Kind, const char*> kShmKinds[] = {
      {ShmCollectives::kAllreduce, "allreduce"},
      {ShmCollectives::kAllgather, "allgather"},
      {ShmCollectives::kReduceScatter, "reduce_scatter"},
      {ShmCollectives::kAlltoall, "alltoall"}};
  const bool gloo_counted_;  // backend_ is Gloo with its sockets known
  mutable std::mutex stats_mu_;
  mutable CommStats stats_;
  mutable std::vector<GlooOp> gloo_inflight_;    // Gloo ops not seen completed
  mutable int64_t gloo_seen_ = 0;                // backend_->bytes_written() at the last reading
  int64_t shm_base_[4] = {0, 0, 0, 0};              // shared-memory counts at the last reset
  int64_t mailbox_base_ = 0;
};

class C10dRendezvous final : public Rendezvous {
 public:
  // `ns`: the prefix of every key this rendezvous writes ("smp/<generation>/"),
  // apart from those of the other rendezvous over the same store (see connect()).
  C10dRendezvous(std::shared_ptr<c10d_compat::Store> store, std::string ns, std::string addr, int port, int rank,
                 int world, std::chrono::milliseconds timeout)
      : store_(std::move(store)), ns_(std::move(ns)), addr_(std::move(addr)), port_(port), rank_(rank), world_(world),
        timeout_(timeout) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  std::unique_ptr<Communicator> new_communicator(const std::string& axis, const std::string& name,
                                                 const std::vector<int>& global_ranks,
                                                 const CommOptions& options) override {
    auto ctx = std::make_shared<Context>();
    ctx->axis = axis;
    ctx->name = name;
    ctx->ranks = global_ranks;
    ctx->timeout_ms = options.timeout.count();
    const std::string what = "communicator '" + name + "' (axis '" + axis + "', world ranks " + join(global_ranks) + ")";
    if (name.empty()) throw Error("rendezvous: " + what + ": empty name");
    std::set<int> seen;
    int me = -1;
    for (size_t i = 0; i < global_ranks.size(); ++i) {
      int g = global_ranks[i];
      if (g < 0 || g >= world_)
        throw Error("rendezvous: " + what + ": rank " + std::to_string(g) + " is outside the world of " +
                    std::to_string(world_));
      if (!seen.insert(g).second) throw Error("rendezvous: " + what + ": rank " + std::to_string(g) + " appears twice");
      if (g == rank_) me = static_cast<int>(i);
    }
    if (me < 0)
      throw Error("rendezvous: " + what + ": this process (world rank " + std::to_string(rank_) +
                  ") is not a member of the group");
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!names_.insert(name).second)
        throw Error("rendezvous: " + what + ": the name is already used by another communicator of this process");
    }
    ctx->rank = me;
    std::unique_ptr<c10d_compat::Backend> backend, nccl;
    std::unique_ptr<ShmCollectives> shm;
    std::unique_ptr<ShmMailbox> mailbox;
    const int n = static_cast<int>(global_ranks.size());
    if (n > 1) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        // Every member must agree on the membership; group rank 0 publishes it.
        const std::string members = join(global_ranks);
        const std::string key = ns_ + "meta/" + name;
        if (me == 0) {
          store_->set(key, members);
        } else {
          std::string theirs = store_->get(key);
          if (theirs != members)
            throw Error("rendezvous: " + what + ": this rank was given world ranks " + members + " but world rank " +
                        std::to_string(global_ranks[0]) + " created '" + name + "' with " + theirs);
        }
        c10d_compat::BackendOptions bo;
        bo.timeout = options.timeout;
        bo.master_addr = addr_;
        backend = c10d_compat::make_backend(*store_, ns_ + "comm/" + name + "/", me, n, bo);
        if (options.cuda && use_nccl(name, what, me, global_ranks, options)) {
          bo.cuda = true;
          bo.cuda_device = options.cuda_device;
          nccl = c10d_compat::make_backend(*store_, ns_ + "comm/" + name + "/nccl/", me, n, bo);
        }
        if (options.shm_slot_bytes > 0)
          shm = ShmCollectives::create(store_, ns_ + "comm/" + name + "/shm/", me, n, options.shm_slot_bytes,
                                     options.timeout);
        // Every member on this host (what ShmCollectives::create found): sends
        // and receives of CPU tensors through shared memory too. Outboxes are
        // made on first use, so groups that never send cost nothing.
        if (shm)
          mailbox = ShmMailbox::create(store_, ns_ + "comm/" + name + "/p2p/", me, n, options.shm_slot_bytes,
                                       options.timeout);
      } catch (const c10d_compat::Failure& f) {
        throw Error("rendezvous: creating " + what + " failed on world rank " + std::to_string(rank_) +
                    (f.timed_out() ? " (timed out: did every member create it?)" : "") + ": " + f.what());
      }
      spdlog::debug("communicator {} ({}{}{}, {} ranks {}) ready in {} ms", name, backend->name(),
                    nccl ? ", NCCL for CUDA tensors" : (options.cuda ? ", CUDA tensors through host memory" : ""),
                    shm ? ", CPU all-reduce/all-gather/reduce-scatter/send/recv through shared memory" : "", n,
                    join(global_ranks),
                    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
    }
    return std::make_unique<C10dCommunicator>(ctx, std::move(backend), std::move(nccl), std::move(shm),
                                              std::move(mailbox));
  }

  // NCCL refuses two ranks of a communicator on one GPU; every member publishes
  // its GPU and all decide alike: "auto" falls back to host memory, "nccl" fails.
  bool use_nccl(const std::string& name, const std::string& what, int me, const std::vector<int>& global_ranks,
                const CommOptions& options) {
    if (options.cuda_backend == "gloo") return false;
    if (!c10d_compat::has_nccl())
      throw Error("rendezvous: " + what + ": CUDA tensors need NCCL, but this LibTorch (" +
                  c10d_compat::torch_version() + ") was built without it (comm.cuda_backend = \"gloo\" avoids it)");
    const std::string prefix = ns_ + "dev/" + name + "/";
    store_->set(prefix + std::to_string(me), options.device_key);
    std::map<std::string, int> first;
    for (size_t i = 0; i < global_ranks.size(); ++i) {
      const std::string key = static_cast<int>(i) == me ? options.device_key : store_->get(prefix + std::to_string(i));
      auto [it, fresh] = first.emplace(key, global_ranks[i]);
      if (fresh) continue;
      const std::string why = "world ranks " + std::to_string(it->second) + " and " + std::to_string(global_ranks[i]) +
                              " share " + key + " and NCCL needs one GPU per rank";
      if (options.cuda_backend == "nccl") throw Error("comm.cuda_backend = \"nccl\": " + what + ": " + why);
      if (me == 0) spdlog::info("{}: {}: CUDA tensors go through host memory and Gloo", what, why);
      return false;
    }
    return true;
  }

  void set(const std::string& key, const std::string& value) override {
    try {
      store_->set(ns_ + "kv/" + key, value);
    } catch (const c10d_compat::Failure& f) {
      throw Error("rendezvous: set('" + key + "') on " + addr_ + ":" + std::to_string(port_) + " failed: " + f.what());
    }
  }

  void shutdown(std::chrono::milliseconds timeout) override {
    try {
      store_->add(ns_ + "shutdown", 1);
      if (rank_ != 0) return;
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      int64_t n = 0;
      while ((n = store_->add(ns_ + "shutdown", 0)) < world_) {
        if (std::chrono::steady_clock::now() >= deadline) {
          spdlog::warn("rendezvous shutdown: only {} of {} ranks finished within {} ms; closing the store anyway", n,
                       world_, timeout.count());
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    } catch (const c10d_compat::Failure& f) {
      spdlog::warn("rendezvous shutdown on {}:{}: {}", addr_, port_, f.what());
    }
  }

  std::string get(const std::string& key) override {
    try {
      return store_->get(ns_ + "kv/" + key);
    } catch (const c10d_compat::Failure& f) {
      throw Error("rendezvous: get('" + key + "') on " + addr_ + ":" + std::to_string(port_) + " failed" +
                  (f.timed_out() ? " (timed out after " + std::to_string(timeout_.count()) + " ms)" : "") + ": " +
                  f.what());
    }
  }

 private:
  std::shared_ptr<c10d_compat::Store> store_;
  std::string ns_;
  std::string addr_;
  int port_, rank_, world_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::set<std::string> names_;
};

// The store of a job's endpoint (master address and port) as this rank sees
// it: world rank 0 hosts the server, the others are clients. A process may join
// the same job again and again (one Runtime after another): every rendezvous of
// a process over one endpoint shares one store, made by the first and kept
// for the process's life, and writes its keys under its own generation.
//
// Made anew for each, a later rendezvous failed now and then (issue 54): world
// rank 0 closes its server only when its runtime is destroyed, after its
// shutdown() has waited for every rank, so a rank that left first and joined
// again connected to the previous runtime's server (still listening on the
// port), read that runtime's keys (a group's members, Gloo's addresses of
// groups that no longer listen: "connect [127.0.0.1]:35721: Connection
// refused") or lost its connection when the server closed ("Connection reset by
// peer"), while rank 0's new server waited for it. One server, and keys the
// previous runtimes never wrote, rule both out. The ranks agree on the
// generation by counting: every rank joins the same runtimes in the same order.
struct EndpointStore {
  std::mutex mu;  // held while the store is made (the server waits there for every rank)
  std::shared_ptr<c10d_compat::Store> store;
  int joins = 0;  // rendezvous made over it
};

std::shared_ptr<EndpointStore> endpoint_store(const std::string& key) {
  // Destroyed at exit (rank 0's server closes then), after the process's last
  // runtime waited in shutdown() for every rank.
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<EndpointStore>> stores;
  std::lock_guard<std::mutex> lock(mu);
  auto& s = stores[key];
  if (!s) s = std::make_shared<EndpointStore>();
  return s;
}

}  // namespace

std::shared_ptr<Rendezvous> Rendezvous::connect(const std::string& master_addr, int master_port, int rank,
                                                int world_size, std::chrono::milliseconds timeout) {
  const std::string where = master_addr + ":" + std::to_string(master_port);
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw Error("rendezvous: invalid rank " + std::to_string(rank) + " of world size " + std::to_string(world_size));
  if (master_port < 1 || master_port > 65535)
    throw Error("rendezvous: invalid master port " + std::to_string(master_port));
  const auto t0 = std::chrono::steady_clock::now();
  // A world of one has no other rank to mix runtimes up: its store lives and
  // dies with its rendezvous (and a second one on the same port is refused).
  std::shared_ptr<EndpointStore> shared;
  std::unique_lock<std::mutex> lock;
  if (world_size > 1) {
    shared = endpoint_store(where + "/" + std::to_string(rank) + "/" + std::to_string(world_size));
    lock = std::unique_lock<std::mutex>(shared->mu);
  }
  std::shared_ptr<c10d_compat::Store> store = shared ? shared->store : nullptr;
  try {
    if (store)
      store->set_timeout(timeout);  // this runtime's run.timeout_s
    else
      store = c10d_compat::connect_tcp_store(master_addr, master_port, rank == 0, world_size, timeout);
  } catch (const c10d_compat::Failure& f) {
    std::string msg = f.what();
    std::string hint;
    if (rank == 0 && (msg.find("in use") != std::string::npos || msg.find("listen") != std::string::npos ||
                      msg.find("bind") != std::string::npos))
      hint = " (is another job using port " + std::to_string(master_port) + "? pick another with --master-port)";
    else if (f.timed_out())
      hint = rank == 0 ? " (not every rank joined within " + std::to_string(timeout.count()) + " ms)"
                       : " (could not reach world rank 0 within " + std::to_string(timeout.count()) + " ms)";
    throw Error("rendezvous at " + where + " failed on world rank " + std::to_string(rank) + " of " +
                std::to_string(world_size) + (rank == 0 ? " (hosting the store)" : "") + hint + ": " + msg);
  }
  int generation = 0;
  if (shared) {
    shared->store = store;
    generation = shared->joins++;
  }
  spdlog::debug("rendezvous at {} ({} ranks, generation {}) done in {} ms", where, world_size, generation,
                std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
  return std::make_shared<C10dRendezvous>(std::move(store), "smp/" + std::to_string(generation) + "/", master_addr,
                                          master_port, rank, world_size, timeout);
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Product: return "product";
  }
  return "?";
}

}  // namespace smp
