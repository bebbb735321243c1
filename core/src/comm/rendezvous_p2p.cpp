// NCCL's point-to-point rules on the CPU. See rendezvous_p2p.h.
#include "comm/rendezvous_p2p.h"

#include <smp/error.h>

#include <ATen/ATen.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

namespace smp {
namespace {

using Clock = std::chrono::steady_clock;

// The wrapped transport's tags for this wrapper's messages: above every
// pipeline tag (base/pipeline_limits.h: below 2^23); per direction of a pair,
// the message's sequence number and its part.
constexpr int kWireBase = 1 << 26;
constexpr int kWireSeqs = 1 << 20;
enum Part { kMeta = 0, kData = 1, kAck = 2 };
int wire_tag(int seq, Part part) { return kWireBase + (seq % kWireSeqs) * 4 + part; }

struct Op {
  bool send = false;
  at::Tensor tensor;
  int peer = 0, tag = 0, seq = 0;
  std::string name;   // "send to group rank 1 (tag 5: ...)"
  std::string phase;  // while it runs: what it waits for
  bool done = false;
  std::exception_ptr error;
};

// The group's one stream: its ops run one at a time, in posted order.
struct Stream {
  std::deque<std::shared_ptr<Op>> queue;  // the front one runs
  std::exception_ptr failed;              // an op failed: every later one fails
  std::thread worker;
};

// What the waiting hosts and the workers share (the works a caller holds may
// outlive the communicator).
struct State {
  Communicator* inner = nullptr;
  std::chrono::milliseconds timeout{0};
  std::function<std::string(int)> describe_tag;
  std::mutex mu;
  std::condition_variable cv;
  Stream stream;
  std::map<int, int> sends, recvs;  // by peer: posted so far (the next sequence numbers)
  bool stop = false;

  std::string where() const {
    std::string ranks;
    for (int r : inner->global_ranks()) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    return "axis '" + inner->axis() + "' (group rank " + std::to_string(inner->rank()) + " of " +
           std::to_string(inner->size()) + ", world ranks " + ranks + ")";
  }
  std::string tag_text(int tag) const {
    const std::string what = describe_tag ? describe_tag(tag) : std::string();
    return "tag " + std::to_string(tag) + (what.empty() ? "" : ": " + what);
  }
  void set_phase(Op& op, std::string phase) {
    std::lock_guard<std::mutex> lock(mu);
    op.phase = std::move(phase);
  }
  // Under mu: the host waiting for `op` is told what holds it up.
  std::string hang_report(const Op& op) const {
    std::ostringstream seconds;
    seconds << timeout.count() / 1000.0;
    std::string m = where() + ": " + op.name + " has not completed in " + seconds.str() +
                    " s under NCCL's point-to-point rules (comm.p2p_semantics = \"rendezvous\": a send completes "
                    "when its receive runs, a pair's ops run in posted order)";
    const auto& q = stream.queue;
    if (q.empty()) return m;
    const Op& front = *q.front();
    m += "; this rank's stream is at " + front.name;
    if (!front.phase.empty()) m += ", " + front.phase;
    std::string behind;
    for (size_t i = 1; i < q.size() && i <= 4; ++i) behind += (behind.empty() ? "" : ", ") + q[i]->name;
    if (q.size() > 5) behind += ", ...";
    if (!behind.empty()) m += "; queued behind it: " + behind;
    return m;
  }
};

void send_message(State& s, Op& op) {
  const std::string peer = "group rank " + std::to_string(op.peer);
  s.set_phase(op, "handing its message to the transport");
  at::Tensor t = op.tensor.contiguous();
  at::Tensor meta = at::empty({3}, at::kLong);
  meta[0] = static_cast<int64_t>(op.tag);
  meta[1] = t.numel();
  meta[2] = static_cast<int64_t>(t.scalar_type());
  auto head = s.inner->send(meta, op.peer, wire_tag(op.seq, kMeta));
  auto body = s.inner->send(t, op.peer, wire_tag(op.seq, kData));
  s.set_phase(op, "waiting for " + peer + "'s matching receive (its #" + std::to_string(op.seq + 1) +
                      " from this rank)");
  at::Tensor ack = at::empty({1}, at::kLong);
  s.inner->recv(ack, op.peer, wire_tag(op.seq, kAck))->wait();
  // Refused: the receiver took the header only; the body is never received.
  if (ack.item<int64_t>() < 0)
    throw Error(s.where() + ": " + peer + "'s receive #" + std::to_string(op.seq + 1) + " from this rank refused " +
                op.name + ": it was posted for another message (NCCL would have matched the two)");
  head->wait();
  body->wait();
}

void receive_message(State& s, Op& op) {
  const std::string peer = "group rank " + std::to_string(op.peer);
  s.set_phase(op, "waiting for " + peer + "'s send #" + std::to_string(op.seq + 1) + " to this rank");
  at::Tensor meta = at::empty({3}, at::kLong);
  s.inner->recv(meta, op.peer, wire_tag(op.seq, kMeta))->wait();
  const int64_t* m = meta.data_ptr<int64_t>();
  if (m[0] != op.tag || m[1] != op.tensor.numel() || m[2] != static_cast<int64_t>(op.tensor.scalar_type()))
    s.inner->send(at::full({1}, -1, at::kLong), op.peer, wire_tag(op.seq, kAck))->wait();  // the sender hears why
  if (m[0] != op.tag)
    throw Error(s.where() + ": NCCL would match " + peer + "'s send #" + std::to_string(op.seq + 1) + " (" +
                s.tag_text(static_cast<int>(m[0])) + ") with this rank's " + op.name +
                ": point-to-point messages pair in posted order, not by tag");
  if (m[1] != op.tensor.numel() || m[2] != static_cast<int64_t>(op.tensor.scalar_type()))
    throw Error(s.where() + ": " + op.name + " expects " + std::to_string(op.tensor.numel()) + " elements of " +
                c10::toString(op.tensor.scalar_type()) + ", " + peer + " sent " + std::to_string(m[1]) + " of " +
                c10::toString(static_cast<at::ScalarType>(m[2])));
  s.inner->recv(op.tensor, op.peer, wire_tag(op.seq, kData))->wait();
  at::Tensor ack = at::zeros({1}, at::kLong);
  s.inner->send(ack, op.peer, wire_tag(op.seq, kAck))->wait();
}

// The stream: runs the posted ops one at a time, in order.
void run_stream(std::shared_ptr<State> s) {
  for (;;) {
    std::shared_ptr<Op> op;
    std::exception_ptr failed;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      Stream& st = s->stream;
      s->cv.wait(lock, [&] { return s->stop || !st.queue.empty(); });
      if (s->stop) return;
      op = st.queue.front();
      failed = st.failed;
    }
    std::exception_ptr error = failed;
    if (!error) {
      try {
        op->send ? send_message(*s, *op) : receive_message(*s, *op);
      } catch (const Error&) {
        error = std::current_exception();
      } catch (const std::exception& e) {
        error = std::make_exception_ptr(Error(s->where() + ": " + op->name + " failed: " + e.what()));
      }
    }
    {
      std::lock_guard<std::mutex> lock(s->mu);
      Stream& st = s->stream;
      op->done = true;
      op->error = error;
      op->phase.clear();
      if (error && !st.failed) st.failed = error;
      st.queue.pop_front();
    }
    s->cv.notify_all();
  }
}

class OpWork final : public Work {
 public:
  OpWork(std::shared_ptr<State> state, std::shared_ptr<Op> op) : s_(std::move(state)), op_(std::move(op)) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(s_->mu);
    const auto deadline = Clock::now() + s_->timeout;
    while (!op_->done)
      if (s_->cv.wait_until(lock, deadline) == std::cv_status::timeout && !op_->done)
        throw Error(s_->hang_report(*op_));
    if (op_->error) std::rethrow_exception(op_->error);
  }
  bool ready() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return op_->done;
  }

 private:
  std::shared_ptr<State> s_;
  std::shared_ptr<Op> op_;
};

class RendezvousP2p final : public Communicator {
 public:
  RendezvousP2p(std::unique_ptr<Communicator> inner, std::chrono::milliseconds timeout,
                std::function<std::string(int)> describe_tag)
      : inner_(std::move(inner)), s_(std::make_shared<State>()) {
    s_->inner = inner_.get();
    s_->timeout = timeout;
    s_->describe_tag = std::move(describe_tag);
  }

  ~RendezvousP2p() override {
    std::vector<std::thread> workers;
    bool busy = false;
    {
      std::unique_lock<std::mutex> lock(s_->mu);
      // Ops in flight finish or fail within a moment; one stuck in the
      // transport (a hang being reported) would hold the exit until the
      // transport's own timeout: its thread is left behind, with what it uses.
      Stream& st = s_->stream;
      s_->cv.wait_for(lock, std::chrono::seconds(1), [&] { return st.queue.empty() || st.failed; });
      s_->stop = true;
      busy = !st.queue.empty();
      workers.push_back(std::move(st.worker));
    }
    s_->cv.notify_all();
    for (auto& w : workers)
      if (w.joinable()) busy ? w.detach() : w.join();
    if (busy) (void)inner_.release();  // still used by a detached worker; the process is failing anyway
  }

  const std::string& axis() const override { return inner_->axis(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::vector<int>& global_ranks() const override { return inner_->global_ranks(); }
  std::shared_ptr<Work> allreduce(at::Tensor& t, ReduceOp op) override { return inner_->allreduce(t, op); }
  std::shared_ptr<Work> allgather(const at::Tensor& in, at::Tensor& out) override {
    return inner_->allgather(in, out);
  }
  std::shared_ptr<Work> reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    return inner_->reduce_scatter(in, out, op);
  }
  std::shared_ptr<Work> alltoall(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& in_splits,
                                 const std::vector<int64_t>& out_splits) override {
    return inner_->alltoall(in, out, in_splits, out_splits);
  }
  std::shared_ptr<Work> broadcast(at::Tensor& t, int root) override { return inner_->broadcast(t, root); }
  void barrier() override { inner_->barrier(); }
  at::Tensor shared_buffer(int64_t numel, at::ScalarType dtype) override { return inner_->shared_buffer(numel, dtype); }
  std::string transport(const std::string& op, const c10::Device& device) const override {
    const std::string t = inner_->transport(op, device);
    return op == "send" || op == "recv" ? t + " (NCCL's rendezvous rules)" : t;
  }
  CommStats stats() const override { return inner_->stats(); }
  void reset_stats() override { inner_->reset_stats(); }
  smp_comm* handle() override { return inner_->handle(); }

  std::shared_ptr<Work> send(const at::Tensor& t, int peer, int tag) override { return post(true, t, peer, tag); }
  std::shared_ptr<Work> recv(at::Tensor& t, int peer, int tag) override { return post(false, t, peer, tag); }

 private:
  std::shared_ptr<Work> post(bool send, const at::Tensor& t, int peer, int tag) {
    const std::string name = std::string(send ? "send to" : "recv from") + " group rank " + std::to_string(peer) +
                             " (" + s_->tag_text(tag) + ")";
    if (peer < 0 || peer >= size() || peer == rank())
      throw Error("invalid " + name + " on " + s_->where() + ": not another group rank");
    if (tag < 0 || tag >= kWireBase) throw Error("invalid " + name + " on " + s_->where() + ": tag out of range");
    if (!t.defined() || !t.device().is_cpu() || t.layout() != at::kStrided)
      throw Error("invalid " + name + " on " + s_->where() + ": comm.p2p_semantics = \"rendezvous\" takes dense CPU tensors");
    auto op = std::make_shared<Op>();
    op->send = send;
    op->tensor = t;
    op->peer = peer;
    op->tag = tag;
    op->name = name;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      Stream& st = s_->stream;
      op->seq = send ? s_->sends[peer]++ : s_->recvs[peer]++;
      st.queue.push_back(op);
      if (!st.worker.joinable()) st.worker = std::thread(run_stream, s_);
    }
    s_->cv.notify_all();
    return std::make_shared<OpWork>(s_, op);
  }

  std::unique_ptr<Communicator> inner_;
  std::shared_ptr<State> s_;
};

}  // namespace

std::unique_ptr<Communicator> with_rendezvous_p2p(std::unique_ptr<Communicator> inner,
                                                  std::chrono::milliseconds timeout,
                                                  std::function<std::string(int)> describe_tag) {
  return std::make_unique<RendezvousP2p>(std::move(inner), timeout, std::move(describe_tag));
}

}  // namespace smp
