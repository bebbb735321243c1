#include "comm/c10d_communicator.h"

#include "comm/byte_accounting.h"
#include "comm/comm_handle.h"
#include "comm/reduce_scatter_emulation.h"
#include "comm/shm_collectives.h"
#include "comm/shm_mailbox.h"
#include "comm/staging.h"
#include "comm/wait.h"

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>

#include <sstream>

namespace smp {
namespace {

std::string shape(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

class C10dCommunicator final : public Communicator {
 public:
  C10dCommunicator(std::shared_ptr<const GroupContext> ctx, Transports t)
      : ctx_(std::move(ctx)), t_(std::move(t)), handle_{this},
        bytes_(t_.gloo.get(), t_.shm.get(), t_.mailbox.get()) {}

  const std::string& axis() const override { return ctx_->axis; }
  int rank() const override { return ctx_->rank; }
  int size() const override { return static_cast<int>(ctx_->ranks.size()); }
  const std::vector<int>& global_ranks() const override { return ctx_->ranks; }
  CommStats stats() const override { return bytes_.stats(); }
  void reset_stats() override { bytes_.reset(); }
  smp_comm* handle() override { return &handle_; }
  std::string transport(const std::string& op, const c10::Device& device) const override {
    return t_.name(op, device);
  }

  std::shared_ptr<Work> allreduce(at::Tensor& t, ReduceOp op) override {
    const std::string name = std::string("allreduce(") + to_string(op) + ")";
    check_dense(name, t, "tensor");
    if (t_.via_host(t)) {
      at::Tensor h = t.cpu();
      return copied_back(allreduce(h, op), t, h);
    }
    const int n = size();
    bytes_.count("allreduce", ring_allreduce_bytes(t.numel(), t.element_size(), n, rank()));
    if (n == 1 || t.numel() == 0) return done(name);
    if (t_.via_shm(t.device())) {
      const int index = t_.shm->shared_buffer_index(t);
      if (index >= 0) return submit(name, [&] { return t_.shm->allreduce_shared(index, op); }, [] {});
      Staged s = stage(t);
      return submit(name, [&] { return t_.shm->allreduce(s.t, op); }, write_back(t, s));
    }
    Staged s = stage(t);
    return submit(name, [&] { return t_.backend_for(t).allreduce(s.t, op); }, write_back(t, s), &t_.backend_for(t));
  }

  at::Tensor shared_buffer(int64_t numel, at::ScalarType dtype) override {
    if (!t_.shm || size() == 1) return {};
    try {
      return t_.shm->shared_buffer(numel, dtype);
    } catch (const c10d_compat::Failure& f) {
      throw ctx_->failure("shared_buffer", f.what(), f.timed_out());
    } catch (const WaitFailed& f) {
      throw ctx_->failure("shared_buffer", f.what(), f.timed_out());
    }
  }

  std::shared_ptr<Work> allgather(const at::Tensor& in, at::Tensor& out) override {
    const char* name = "allgather";
    check_dense(name, in, "in");
    check_dense(name, out, "out");
    const int n = size();
    check_same_kind(name, in, out);
    if (t_.via_host(in)) {
      at::Tensor hin = in.cpu(), hout = host_like(out);
      return copied_back(allgather(hin, hout), out, hout, hin);
    }
    auto want = in.sizes().vec();
    if (want.empty()) throw ctx_->invalid(name, "in must have at least one dimension (gathered along dim 0)");
    want[0] *= n;
    if (out.sizes().vec() != want)
      throw ctx_->invalid(name, "out has shape " + shape(out) + ", expected " + shape(at::empty(want, at::kByte)) +
                                    " (in " + shape(in) + " times " + std::to_string(n) + " ranks along dim 0)");
    bytes_.count(name, (n - 1) * nbytes(in));
    if (n == 1) {
      out.copy_(in);
      return done(name);
    }
    if (in.numel() == 0) return done(name);
    Staged si = stage(in), so = stage(out);
    if (t_.via_shm(in.device()))
      return submit(name, [&] { return t_.shm->allgather(si.t, so.t); }, write_back(out, so, si.t));
    return submit(name, [&] { return t_.backend_for(in).allgather(si.t, so.t); }, write_back(out, so, si.t),
                  &t_.backend_for(in));
  }

  std::shared_ptr<Work> reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    const std::string name = std::string("reduce_scatter(") + to_string(op) + ")";
    check_dense(name, in, "in");
    check_dense(name, out, "out");
    check_same_kind(name, in, out);
    if (t_.via_host(in)) {
      at::Tensor hin = in.cpu(), hout = host_like(out);
      return copied_back(reduce_scatter(hin, hout, op), out, hout, hin);
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
    bytes_.count("reduce_scatter", nbytes(in) - nbytes(out));
    if (n == 1) {
      out.copy_(in);
      return done(name);
    }
    if (in.numel() == 0) return done(name);
    Staged si = stage(in);
    if (t_.native_reduce_scatter(in, rows)) {
      Staged so = stage(out);
      return submit(name, [&] { return t_.nccl->reduce_scatter(si.t, so.t, op); }, write_back(out, so, si.t),
                    t_.nccl.get());
    }
    if (t_.via_shm(in.device())) {
      Staged so = stage(out);
      const int64_t row = rows > 0 ? in.numel() / rows : 0;
      std::vector<int64_t> counts(n);
      for (int i = 0; i < n; ++i) counts[i] = split_rows(rows, n, i) * row;
      return submit(name, [&] { return t_.shm->reduce_scatter(si.t, so.t, counts, op); }, write_back(out, so, si.t));
    }
    EmulatedReduceScatter e = emulate_reduce_scatter(si.t, out, n, op);
    c10d_compat::Backend* via = &t_.backend_for(in);
    return submit(name, [&] { return via->alltoall(si.t, e.received, e.in_splits, e.out_splits); }, e.finish, via);
  }

  std::shared_ptr<Work> alltoall(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& in_splits_arg,
                                 const std::vector<int64_t>& out_splits_arg) override {
    const char* name = "alltoall";
    check_dense(name, in, "in");
    check_dense(name, out, "out");
    check_same_kind(name, in, out);
    if (t_.via_host(in)) {
      at::Tensor hin = in.cpu(), hout = host_like(out);
      return copied_back(alltoall(hin, hout, in_splits_arg, out_splits_arg), out, hout, hin);
    }
    const int n = size(), r = rank();
    if (in.dim() == 0 || out.dim() == 0) throw ctx_->invalid(name, "in and out must have at least one dimension");
    if (in.sizes().slice(1) != out.sizes().slice(1))
      throw ctx_->invalid(name, "in " + shape(in) + " and out " + shape(out) + " differ beyond dim 0");
    std::vector<int64_t> is = splits(in_splits_arg, in, "in"), os = splits(out_splits_arg, out, "out");
    const int64_t row_bytes = in.size(0) ? nbytes(in) / in.size(0) : 0;
    int64_t sent = 0;
    for (int j = 0; j < n; ++j)
      if (j != r) sent += is[j] * row_bytes;
    bytes_.count(name, sent);
    if (n == 1) {
      out.copy_(in);
      return done(name);
    }
    Staged si = stage(in), so = stage(out);
    // Moving rows needs no arithmetic: bf16 travels as bytes (a row of h
    // values as 2h), which every backend has (Gloo of LibTorch 1.13 has no bf16).
    auto bits = [](const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 ? t.view(at::kByte) : t; };
    if (t_.via_shm(in.device())) {
      // Slices in elements of the (byte-viewed) tensors.
      const at::Tensor i = bits(si.t), o = bits(so.t);
      const int64_t row = c10::multiply_integers(i.sizes().slice(1));
      std::vector<int64_t> ic(is), oc(os);
      for (auto& x : ic) x *= row;
      for (auto& x : oc) x *= row;
      return submit(name, [&] { return t_.shm->alltoall(i, o, ic, oc); }, write_back(out, so, si.t));
    }
    return submit(name,
                  [&] {
                    at::Tensor i = bits(si.t), o = bits(so.t);
                    return t_.backend_for(in).alltoall(i, o, is, os);
                  },
                  write_back(out, so, si.t), &t_.backend_for(in));
  }

  std::shared_ptr<Work> broadcast(at::Tensor& t, int root) override {
    const std::string name = "broadcast(root " + std::to_string(root) + ")";
    check_dense(name, t, "tensor");
    if (t_.via_host(t)) {
      at::Tensor h = t.cpu();
      return copied_back(broadcast(h, root), t, h);
    }
    const int n = size();
    if (root < 0 || root >= n)
      throw ctx_->invalid(name, "root " + std::to_string(root) + " is not a group rank (size " + std::to_string(n) + ")");
    bytes_.count("broadcast", tree_broadcast_bytes(nbytes(t), n, rank(), root));
    if (n == 1 || t.numel() == 0) return done(name);
    Staged s = stage(t);
    return submit(name, [&] { return t_.backend_for(t).broadcast(s.t, root); }, write_back(t, s), &t_.backend_for(t));
  }

  std::shared_ptr<Work> send(const at::Tensor& t, int peer, int tag) override {
    const std::string name = "send(to group rank " + std::to_string(peer) + ", tag " + std::to_string(tag) + ")";
    check_dense(name, t, "tensor");
    check_peer(name, peer, tag);
    if (t_.via_host(t)) return send(t.cpu(), peer, tag);
    bytes_.count("send", nbytes(t));
    Staged s = stage(t);
    if (t_.via_mailbox(t)) {
      // A message the mailbox has no room for goes through Gloo: tracked then.
      bytes_.before_possible_gloo_op();
      bool through_gloo = false;
      return submit(name, [&] { return t_.mailbox->send(s.t, peer, tag, *t_.gloo, &through_gloo); },
                    [keep = s.t] {}, nullptr, &through_gloo);
    }
    return submit(name, [&] { return t_.backend_for(t).send(s.t, peer, tag); }, [keep = s.t] {}, &t_.backend_for(t));
  }

  std::shared_ptr<Work> recv(at::Tensor& t, int peer, int tag) override {
    const std::string name = "recv(from group rank " + std::to_string(peer) + ", tag " + std::to_string(tag) + ")";
    check_dense(name, t, "tensor");
    check_peer(name, peer, tag);
    if (t_.via_host(t)) {
      at::Tensor h = host_like(t);
      return copied_back(recv(h, peer, tag), t, h);
    }
    bytes_.count("recv", 0);
    Staged s = stage(t);
    if (t_.via_mailbox(t))
      return submit(name, [&] { return t_.mailbox->recv(s.t, peer, tag, *t_.gloo); }, write_back(t, s));
    return submit(name, [&] { return t_.backend_for(t).recv(s.t, peer, tag); }, write_back(t, s));
  }

  void barrier() override {
    bytes_.count("barrier", 0);
    if (size() == 1) return;
    submit("barrier", [&] { return t_.gloo->barrier(); }, nullptr, t_.gloo.get())->wait();
  }

 private:
  std::shared_ptr<Work> done(const std::string& op) {
    bytes_.take_trace_tag();  // nothing to trace: a group of one, or an empty tensor
    return std::make_shared<CommWork>(ctx_, op, nullptr, nullptr);
  }

  // `via`: the c10d backend the op goes through (null: shared memory), whose
  // bytes are counted for it (Gloo) or whose call is tallied as uncounted (NCCL).
  // `through_gloo`, set by submit_fn: the mailbox sent the message through Gloo.
  template <class Submit>
  std::shared_ptr<Work> submit(const std::string& op, Submit&& submit_fn, std::function<void()> finish,
                               c10d_compat::Backend* via = nullptr, const bool* through_gloo = nullptr) {
    if (via) bytes_.before_backend_op(*via);
    std::shared_ptr<c10d_compat::PendingWork> pending;
    try {
      pending = submit_fn();
    } catch (const c10d_compat::Failure& f) {
      throw ctx_->failure(op, f.what(), f.timed_out());
    } catch (const WaitFailed& f) {  // a shared-memory send waits for room
      throw ctx_->failure(op, f.what(), f.timed_out());
    }
    if ((via && via == t_.gloo.get()) || (through_gloo && *through_gloo)) bytes_.track_gloo(pending);
    return std::make_shared<CommWork>(ctx_, op, std::move(pending), std::move(finish), bytes_.take_trace_tag());
  }

  std::vector<int64_t> splits(const std::vector<int64_t>& given, const at::Tensor& t, const char* which) const {
    const int n = size();
    std::vector<int64_t> s = given;
    if (s.empty()) {
      if (t.size(0) % n != 0)
        throw ctx_->invalid("alltoall", std::string(which) + " has " + std::to_string(t.size(0)) +
                                            " rows, not divisible by the group size " + std::to_string(n) +
                                            " (give explicit splits)");
      s.assign(n, t.size(0) / n);
    }
    if (static_cast<int>(s.size()) != n)
      throw ctx_->invalid("alltoall", std::string(which) + "_splits has " + std::to_string(s.size()) +
                                          " entries for a group of " + std::to_string(n));
    int64_t sum = 0;
    for (auto x : s) {
      if (x < 0) throw ctx_->invalid("alltoall", std::string(which) + "_splits has a negative entry");
      sum += x;
    }
    if (sum != t.size(0))
      throw ctx_->invalid("alltoall", std::string(which) + "_splits sum to " + std::to_string(sum) + " but " + which +
                                          " has " + std::to_string(t.size(0)) + " rows");
    return s;
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

  std::shared_ptr<const GroupContext> ctx_;
  Transports t_;
  smp_comm handle_;
  ByteAccounting bytes_;  // after t_: it reads the transports' counts
};

}  // namespace

std::unique_ptr<Communicator> make_c10d_communicator(std::shared_ptr<const GroupContext> ctx, Transports transports) {
  transports.size = static_cast<int>(ctx->ranks.size());
  return std::make_unique<C10dCommunicator>(std::move(ctx), std::move(transports));
}

}  // namespace smp
