// A test worker for smp-launch (not a gtest): checks the communicators against
// serial computations. Exit 0 = pass; otherwise the failing check is printed.
//
//   --mode check      every collective on every mesh axis (pp, dp, tp, mp, world),
//                     plus byte counts against the documented formulas
//   --mode allreduce  one world allreduce (two-node test)
//   --mode loop       writes <pid-dir>/rank-R.pid, then allreduces until killed
//   --mode timeout    rank --skip-rank skips an allreduce on the tp axis; the
//                     others must get an smp::Error (exit 3 after printing it)
//   --mode fail-once  rank 1 exits 5 on the first attempt (SMP_RESTART_COUNT=0),
//                     then everyone does the allreduce check
//   --mode env        prints the ProcessEnv and exits
//   --mode shm        the shared-memory all-reduce (tiny 4 KiB slots, so most
//                     tensors go in many chunks) against Gloo's and the serial
//                     result: dtypes, ops, sizes, strides, async, growth
//   --mode shm-mismatch  ranks pass different sizes: everyone must get an error
//   --mode shm-peer-exit rank --skip-rank exits mid-job: the others must hear of
//                     it long before the (60 s) timeout
//   --mode bytes      what each transport counts as sent (CommStats::sent)
//                     against the analytic count, op by op, over shm and Gloo
//   --mode rendezvous NCCL's point-to-point rules on the CPU (rendezvous_p2p.h),
//                     world 2: the order rank 0 send A, send B, recv C / rank 1
//                     recv A, send C, recv B completes with a communicator per
//                     direction, a receive of another tag than the sender's
//                     next is refused, and on one communicator the order hangs
//                     and both ranks report what waits for what
#include <smp/error.h>
#include <smp/logging.h>
#include <smp/mesh.h>
#include <smp/process_env.h>

#include "comm/communicator.h"
#include "comm/rendezvous_p2p.h"

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

namespace {

using smp::Communicator;
using smp::ReduceOp;

struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string str(const at::Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

void expect_eq(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type() || !at::equal(got, want))
    throw CheckFailed(what + ": got\n" + str(got) + "\nexpected\n" + str(want));
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw CheckFailed(what);
}

// Independent re-statement of the byte formulas documented in communicator.cpp.
int64_t chunk(int64_t numel, int n, int i) { return numel / n + (i < numel % n ? 1 : 0); }
int64_t ring_bytes(int64_t numel, int64_t es, int n, int r) {
  if (n == 1) return 0;
  return 2 * numel * es - chunk(numel, n, (r + 1) % n) * es - chunk(numel, n, (r + 2) % n) * es;
}

// Messages rank r sends in a binomial-tree broadcast, by playing the tree top
// down: in round k every rank that has the data (relative rank v < 2^k)
// sends it to v + 2^k.
int tree_sends(int n, int r, int root) {
  const int me = (r - root + n) % n;
  int top = 1;
  while (top < n) top <<= 1;
  int sends = 0;
  for (int step = 1; step < top; step <<= 1)  // step = 2^k: ranks [0, step) have it
    if (me < step && me + step < n) ++sends;
  return sends;
}

class Checker {
 public:
  Checker(Communicator& c, std::string label) : c_(c), label_(std::move(label)) {}

  void run() {
    c_.reset_stats();
    const auto& G = c_.global_ranks();
    n_ = c_.size();
    r_ = c_.rank();
    me_ = G[r_];
    allreduce();
    allgather();
    reduce_scatter();
    alltoall();
    broadcast();
    send_recv();
    c_.barrier();
    calls_["barrier"]++;
    async_handles();
    // Calls were counted for every op, and the totals add up.
    const smp::CommStats st = c_.stats();
    for (const auto& [op, k] : calls_) {
      auto it = st.calls.find(op);
      expect(it != st.calls.end() && it->second == k,
             label_ + " stats.calls[" + op + "] = " + (it == st.calls.end() ? std::string("missing") : std::to_string(it->second)) +
                 ", expected " + std::to_string(k));
    }
    int64_t total = 0;
    for (const auto& [op, b] : st.analytic) total += b;
    expect(total == st.total_analytic(), label_ + " total_analytic");
  }

 private:
  at::TensorOptions f64() const { return at::TensorOptions().dtype(at::kDouble); }
  at::Tensor base(int w, int64_t numel) const { return at::arange(numel, f64()) + 1000.0 * w; }
  const std::vector<int>& G() const { return c_.global_ranks(); }

  // Runs op and checks the byte delta for `key`.
  template <class F>
  void counted(const std::string& key, int64_t want_bytes, const std::string& what, F&& f) {
    int64_t before = bytes(key);
    f();
    calls_[key]++;
    int64_t delta = bytes(key) - before;
    expect(delta == want_bytes, label_ + " " + what + ": counted " + std::to_string(delta) + " bytes for '" + key +
                                    "', expected " + std::to_string(want_bytes));
  }
  int64_t bytes(const std::string& key) const {
    const smp::CommStats st = c_.stats();
    auto it = st.analytic.find(key);
    return it == st.analytic.end() ? 0 : it->second;
  }

  void allreduce() {
    for (int64_t numel : {7, 12, 1}) {
      at::Tensor t = base(me_, numel), want = at::zeros({numel}, f64());
      for (int g : G()) want += base(g, numel);
      counted("allreduce", ring_bytes(numel, 8, n_, r_), "allreduce sum numel " + std::to_string(numel),
              [&] { c_.allreduce(t, ReduceOp::Sum)->wait(); });
      expect_eq(t, want, label_ + " allreduce sum numel " + std::to_string(numel));
    }
    auto signed_base = [&](int g) { return base(g, 6) * ((g % 2) ? -1.0 : 1.0); };
    {
      at::Tensor t = signed_base(me_), want = signed_base(G()[0]);
      for (int g : G()) want = at::maximum(want, signed_base(g));
      counted("allreduce", ring_bytes(6, 8, n_, r_), "allreduce max", [&] { c_.allreduce(t, ReduceOp::Max)->wait(); });
      expect_eq(t, want, label_ + " allreduce max");
    }
    {
      at::Tensor t = signed_base(me_), want = signed_base(G()[0]);
      for (int g : G()) want = at::minimum(want, signed_base(g));
      counted("allreduce", ring_bytes(6, 8, n_, r_), "allreduce min", [&] { c_.allreduce(t, ReduceOp::Min)->wait(); });
      expect_eq(t, want, label_ + " allreduce min");
    }
    {
      auto val = [](int g) { return at::full({5}, static_cast<double>(g % 3 + 1), at::kDouble); };
      at::Tensor t = val(me_), want = at::ones({5}, at::kDouble);
      for (int g : G()) want = want * val(g);
      counted("allreduce", ring_bytes(5, 8, n_, r_), "allreduce product",
              [&] { c_.allreduce(t, ReduceOp::Product)->wait(); });
      expect_eq(t, want, label_ + " allreduce product");
    }
    {  // int64
      auto val = [](int g) { return at::arange(9, at::kLong) * (g + 1); };
      at::Tensor t = val(me_), want = at::zeros({9}, at::kLong);
      for (int g : G()) want += val(g);
      counted("allreduce", ring_bytes(9, 8, n_, r_), "allreduce int64", [&] { c_.allreduce(t, ReduceOp::Sum)->wait(); });
      expect_eq(t, want, label_ + " allreduce int64");
    }
    {  // float32, non-contiguous view: the result must land in the caller's tensor
      auto val = [&](int g) { return base(g, 12).to(at::kFloat).view({3, 4}); };
      at::Tensor storage = val(me_);
      at::Tensor t = storage.t();
      expect(!t.is_contiguous(), "test setup: view should be non-contiguous");
      at::Tensor want = at::zeros({3, 4}, at::kFloat);
      for (int g : G()) want += val(g);
      counted("allreduce", ring_bytes(12, 4, n_, r_), "allreduce non-contiguous",
              [&] { c_.allreduce(t, ReduceOp::Sum)->wait(); });
      expect_eq(storage, want, label_ + " allreduce non-contiguous (storage)");
    }
  }

  void allgather() {
    auto val = [&](int g) { return base(g, 6).view({2, 3}); };
    at::Tensor in = val(me_), out = at::empty({2 * n_, 3}, f64());
    std::vector<at::Tensor> parts;
    for (int g : G()) parts.push_back(val(g));
    counted("allgather", (n_ - 1) * 48, "allgather", [&] { c_.allgather(in, out)->wait(); });
    expect_eq(out, at::cat(parts, 0), label_ + " allgather");
  }

  void reduce_scatter() {
    // Even split, an odd row count (uneven), and fewer rows than ranks.
    std::vector<int64_t> row_counts = {2 * n_, 2 * n_ + 1};
    if (n_ > 2) row_counts.push_back(n_ - 1);
    for (int64_t rows : row_counts) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        auto val = [&](int g) { return (base(g, rows * 3) * ((g % 2) ? -1.0 : 1.0)).view({rows, 3}); };
        at::Tensor full = val(G()[0]);
        for (size_t i = 1; i < G().size(); ++i)
          full = op == ReduceOp::Sum ? full + val(G()[i]) : at::maximum(full, val(G()[i]));
        at::Tensor want = full.tensor_split(n_, 0)[r_].contiguous();
        at::Tensor in = val(me_), out = at::empty_like(want);
        const std::string what = std::string("reduce_scatter ") + (op == ReduceOp::Sum ? "sum" : "max") + " rows " +
                                 std::to_string(rows);
        counted("reduce_scatter", (rows - want.size(0)) * 3 * 8, what,
                [&] { c_.reduce_scatter(in, out, op)->wait(); });
        expect_eq(out, want, label_ + " " + what);
      }
    }
    // A wrong output shape is an smp::Error naming the op.
    if (n_ > 1) {
      at::Tensor in = base(me_, 2 * n_ * 3).view({2 * n_, 3}), bad = at::empty({3, 3}, f64());
      bool threw = false;
      try {
        c_.reduce_scatter(in, bad)->wait();
      } catch (const smp::Error& e) {
        threw = std::string(e.what()).find("reduce_scatter") != std::string::npos;
      }
      expect(threw, label_ + " reduce_scatter with a wrong out shape should throw smp::Error naming the op");
    }
  }

  void alltoall() {
    // Uneven (and sometimes empty) splits: rank a sends s(a, b) rows to rank b.
    auto s = [](int a, int b) -> int64_t { return (a * b + a + b) % 3; };
    // Row k of the block a -> b: [1000*G[a] + 10*b + k, -(same)].
    auto block = [&](int a, int b) {
      at::Tensor col = at::arange(s(a, b), f64()) + (1000.0 * G()[a] + 10.0 * b);
      return at::stack({col, -col}, 1);
    };
    std::vector<int64_t> in_splits(n_), out_splits(n_);
    std::vector<at::Tensor> in_parts, want_parts;
    for (int j = 0; j < n_; ++j) {
      in_splits[j] = s(r_, j);
      out_splits[j] = s(j, r_);
      in_parts.push_back(block(r_, j));
      want_parts.push_back(block(j, r_));
    }
    at::Tensor in = at::cat(in_parts, 0), want = at::cat(want_parts, 0);
    at::Tensor out = at::empty({want.size(0), 2}, f64());
    int64_t sent = 0;
    for (int j = 0; j < n_; ++j)
      if (j != r_) sent += in_splits[j] * 16;
    counted("alltoall", sent, "alltoall uneven", [&] { c_.alltoall(in, out, in_splits, out_splits)->wait(); });
    expect_eq(out, want, label_ + " alltoall uneven");

    // Equal splits (empty split vectors): block j of rank a is base(G[a]) + 100*j.
    std::vector<at::Tensor> ins, wants;
    for (int j = 0; j < n_; ++j) {
      ins.push_back(base(me_, 4) + 100.0 * j);
      wants.push_back(base(G()[j], 4) + 100.0 * r_);
    }
    at::Tensor in2 = at::stack(ins, 0).view({n_ * 2, 2}), want2 = at::stack(wants, 0).view({n_ * 2, 2});
    at::Tensor out2 = at::empty_like(want2);
    counted("alltoall", (n_ - 1) * 32, "alltoall equal", [&] { c_.alltoall(in2, out2, {}, {})->wait(); });
    expect_eq(out2, want2, label_ + " alltoall equal");
  }

  void broadcast() {
    for (int root : {n_ - 1, 0}) {
      at::Tensor t = base(me_, 5), want = base(G()[root], 5);
      counted("broadcast", tree_sends(n_, r_, root) * 40, "broadcast root " + std::to_string(root),
              [&] { c_.broadcast(t, root)->wait(); });
      expect_eq(t, want, label_ + " broadcast root " + std::to_string(root));
    }
  }

  void send_recv() {
    if (n_ == 1) return;
    const int dst = (r_ + 1) % n_, src = (r_ - 1 + n_) % n_;
    // Two messages with different tags, received in the opposite order.
    at::Tensor a = base(me_, 9), b = base(me_, 3) * -1.0;
    at::Tensor ra = at::empty({9}, f64()), rb = at::empty({3}, f64());
    auto wb = c_.recv(rb, src, 22);
    auto wa = c_.recv(ra, src, 21);
    std::shared_ptr<smp::Work> sa, sb;
    counted("send", 72 + 24, "send", [&] {
      sa = c_.send(a, dst, 21);
      sb = c_.send(b, dst, 22);
    });
    calls_["send"]++;  // two sends
    calls_["recv"] += 2;
    wb->wait();
    wa->wait();
    sa->wait();
    sb->wait();
    expect_eq(ra, base(G()[src], 9), label_ + " recv tag 21");
    expect_eq(rb, base(G()[src], 3) * -1.0, label_ + " recv tag 22");
    expect(bytes("recv") == 0, label_ + " recv counts 0 bytes");
  }

  void async_handles() {
    std::vector<at::Tensor> ts, wants;
    std::vector<std::shared_ptr<smp::Work>> works;
    for (int k = 0; k < 3; ++k) {
      ts.push_back(base(me_, 4) * (k + 1));
      at::Tensor w = at::zeros({4}, f64());
      for (int g : G()) w += base(g, 4) * (k + 1);
      wants.push_back(w);
    }
    for (int k = 0; k < 3; ++k) works.push_back(c_.allreduce(ts[k]));
    calls_["allreduce"] += 3;
    for (int k = 2; k >= 0; --k) works[k]->wait();
    works[0]->wait();  // waiting twice is fine
    for (int k = 0; k < 3; ++k) expect_eq(ts[k], wants[k], label_ + " async allreduce " + std::to_string(k));
  }

  Communicator& c_;
  std::string label_;
  int n_ = 1, r_ = 0, me_ = 0;
  std::map<std::string, int64_t> calls_;
};

// This process's CPU affinity as "0,1,...".
std::string affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out += (out.empty() ? "" : ",") + std::to_string(c);
  return out;
}

// Runs f, which must throw smp::Error: prints and logs it with the time it took
// and returns 3; returns 4 (after printing `if_not`) when f completes.
template <class F>
int expect_error(const std::string& who, F&& f, const std::string& if_not) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
  } catch (const smp::Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    spdlog::error("{}", e.what());
    std::cerr << who << " caught after " << ms << " ms: " << e.what() << std::endl;
    return 3;
  }
  std::cerr << if_not << std::endl;
  return 4;
}

struct Args {
  std::string mode = "check";
  int pp = 1, dp = 0, tp = 1;
  std::string order = "pp,dp,tp";
  int timeout_ms = 20000;
  int connect_timeout_ms = 60000;
  std::string pid_dir;
  int steps = 1000000;
  int skip_rank = 1;
  std::string run_dir;
  double shm_mb = -1;  // < 0: CommOptions' default
};

// Integer-valued data (exact in every dtype tested) so sums compare bit for bit.
at::Tensor sample(int64_t numel, at::ScalarType dtype, int rank, int salt) {
  return ((at::arange(numel, at::kLong) * (7 + salt) + rank * 13 + salt) % 23 - 11).to(dtype);
}

int run_shm(const Args& a, smp::Rendezvous& rdv, const smp::DeviceMesh& mesh, smp::CommOptions opts) {
  const auto& ranks = mesh.group(smp::Axis::World);
  opts.shm_slot_bytes = 4096;
  auto shm = rdv.new_communicator("world", "world.shm", ranks, opts);
  opts.shm_slot_bytes = 0;
  auto gloo = rdv.new_communicator("world", "world.gloo", ranks, opts);
  const int n = shm->size(), me = shm->rank();
  expect(n == 1 || shm->transport("allreduce", at::kCPU) == "shm",
         "allreduce transport is " + shm->transport("allreduce", at::kCPU) + ", expected shm");
  expect(n == 1 || gloo->transport("allreduce", at::kCPU) == "gloo", "shm_slot_bytes = 0 must mean gloo");
  for (const char* op : {"allgather", "reduce_scatter", "alltoall"})
    expect(n == 1 || shm->transport(op, at::kCPU) == "shm", std::string(op) + " should go through shm");
  expect(shm->transport("broadcast", at::kCPU) == gloo->transport("broadcast", at::kCPU), "broadcast goes to the backend");
  int checks = 0;
  int salt = 0;
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kLong, at::kInt, at::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Product}) {
      // 1 element, an odd size inside one slot, several slots with a ragged tail.
      for (int64_t numel : {int64_t{1}, int64_t{333}, int64_t{5000}}) {
        if (op == ReduceOp::Product && numel > 333) continue;  // keep products small and exact
        ++salt;
        at::Tensor a1 = sample(numel, dtype, me, salt), a2 = a1.clone();
        if (op == ReduceOp::Product) a1 = a1.remainder(3).add(1).to(dtype), a2 = a1.clone();
        at::Tensor want = op == ReduceOp::Product ? at::ones({numel}, dtype) : at::Tensor();
        for (int r = 0; r < n; ++r) {
          at::Tensor x = sample(numel, dtype, r, salt);
          if (op == ReduceOp::Product) x = x.remainder(3).add(1).to(dtype);
          if (op == ReduceOp::Sum) want = want.defined() ? want + x : x.clone();
          if (op == ReduceOp::Max) want = want.defined() ? at::maximum(want, x) : x.clone();
          if (op == ReduceOp::Min) want = want.defined() ? at::minimum(want, x) : x.clone();
          if (op == ReduceOp::Product) want = want * x;
        }
        const std::string what = std::string("shm allreduce ") + c10::toString(dtype) + " op " +
                                 std::to_string(static_cast<int>(op)) + " numel " + std::to_string(numel);
        shm->allreduce(a1, op)->wait();
        expect_eq(a1, want.to(dtype), what + " vs serial");
        if (dtype != at::kBFloat16) {  // Gloo in LibTorch 1.13 has no bfloat16
          gloo->allreduce(a2, op)->wait();
          expect_eq(a1, a2, what + " vs gloo");
        }
        ++checks;
      }
    }
  }
  // All-gather and reduce-scatter (uneven rows: tensor_split), many 4 KiB chunks, vs Gloo and serial.
  for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kLong}) {
    for (int64_t rows : {int64_t{1}, int64_t{7}, int64_t{1001}}) {
      ++salt;
      const int64_t cols = 3;
      at::Tensor in = sample(rows * cols, dtype, me, salt).view({rows, cols});
      at::Tensor got = at::empty({n * rows, cols}, dtype), via_gloo = at::empty({n * rows, cols}, dtype);
      shm->allgather(in, got)->wait();
      gloo->allgather(in, via_gloo)->wait();
      at::Tensor want = at::empty({n * rows, cols}, dtype);
      for (int r = 0; r < n; ++r) want.narrow(0, r * rows, rows).copy_(sample(rows * cols, dtype, r, salt).view({rows, cols}));
      const std::string what = std::string("shm allgather ") + c10::toString(dtype) + " rows " + std::to_string(rows);
      expect_eq(got, want, what + " vs serial");
      expect_eq(got, via_gloo, what + " vs gloo");
      ++checks;
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        // Reduce-scatter of n*rows+1 rows: slices of rows+1 (rank 0) and rows.
        const int64_t total = n * rows + 1, mine = total / n + (me < total % n ? 1 : 0);
        int64_t first = 0;
        for (int r = 0; r < me; ++r) first += total / n + (r < total % n ? 1 : 0);
        at::Tensor x = sample(total * cols, dtype, me, salt + 1).view({total, cols});
        at::Tensor out = at::empty({mine, cols}, dtype), out_gloo = at::empty({mine, cols}, dtype);
        shm->reduce_scatter(x, out, op)->wait();
        gloo->reduce_scatter(x, out_gloo, op)->wait();
        at::Tensor full;
        for (int r = 0; r < n; ++r) {
          at::Tensor y = sample(total * cols, dtype, r, salt + 1).view({total, cols});
          full = !full.defined() ? y.clone() : (op == ReduceOp::Sum ? full + y : at::maximum(full, y));
        }
        const std::string rs = std::string("shm reduce_scatter ") + c10::toString(dtype) + " rows " +
                               std::to_string(total) + " op " + smp::to_string(op);
        expect_eq(out, full.narrow(0, first, mine), rs + " vs serial");
        expect_eq(out, out_gloo, rs + " vs gloo");
        ++checks;
      }
    }
  }
  // All-to-all(v): uneven and empty slices, one row to many 4 KiB chunks,
  // bf16 moved as bytes, vs serial and Gloo.
  for (at::ScalarType dtype : {at::kFloat, at::kLong, at::kBFloat16}) {
    for (int64_t scale : {int64_t{1}, int64_t{700}}) {
      auto rows = [&](int a, int b) -> int64_t { return ((a * b + a + b) % 3) * scale; };
      auto block = [&](int a, int b) {
        return (at::arange(rows(a, b) * 3, at::kDouble).view({-1, 3}) + 100000.0 * a + 1000.0 * b).to(dtype);
      };
      std::vector<int64_t> is(n), os(n);
      std::vector<at::Tensor> ins, wants;
      for (int j = 0; j < n; ++j) {
        is[j] = rows(me, j), os[j] = rows(j, me);
        ins.push_back(block(me, j)), wants.push_back(block(j, me));
      }
      at::Tensor in = at::cat(ins, 0), want = at::cat(wants, 0), got = at::empty_like(want);
      shm->alltoall(in, got, is, os)->wait();
      const std::string what = std::string("shm alltoall ") + c10::toString(dtype) + " scale " + std::to_string(scale);
      expect_eq(got, want, what + " vs serial");
      if (dtype != at::kBFloat16) {
        at::Tensor via_gloo = at::empty_like(want);
        gloo->alltoall(in, via_gloo, is, os)->wait();
        expect_eq(got, via_gloo, what + " vs gloo");
      }
      ++checks;
    }
  }
  // Random floats: every rank must end with the same bits (each part is reduced once).
  {
    at::Tensor x = at::randn({10007}, at::TensorOptions().dtype(at::kFloat)).mul_(me + 1);
    shm->allreduce(x)->wait();
    at::Tensor all = at::empty({n * 10007}, at::kFloat);
    gloo->allgather(x, all)->wait();
    for (int r = 0; r < n; ++r) expect(at::equal(all.narrow(0, r * 10007, 10007), x), "ranks differ after shm allreduce");
    ++checks;
  }
  // A non-contiguous tensor (staged through a contiguous copy and written back).
  {
    at::Tensor base = sample(60, at::kFloat, me, 99).view({6, 10}), t = base.t();
    at::Tensor want = at::zeros({10, 6});
    for (int r = 0; r < n; ++r) want += sample(60, at::kFloat, r, 99).view({6, 10}).t();
    shm->allreduce(t)->wait();
    expect_eq(t, want, "shm allreduce of a transposed view");
    expect_eq(base.t(), want, "the transposed view's base");
    ++checks;
  }
  // Several in flight, waited out of order; then the slots grow (64 KiB, the default 16 MiB) on a new communicator.
  {
    std::vector<at::Tensor> ts, wants;
    std::vector<std::shared_ptr<smp::Work>> works;
    for (int k = 0; k < 4; ++k) {
      ts.push_back(sample(3000 + k, at::kDouble, me, k));
      at::Tensor w = at::zeros({3000 + k}, at::kDouble);
      for (int r = 0; r < n; ++r) w += sample(3000 + k, at::kDouble, r, k);
      wants.push_back(w);
    }
    for (auto& t : ts) works.push_back(shm->allreduce(t));
    for (int k = 3; k >= 0; --k) works[k]->wait();
    for (int k = 0; k < 4; ++k) expect_eq(ts[k], wants[k], "async shm allreduce " + std::to_string(k));
    ++checks;
    opts.shm_slot_bytes = int64_t{16} << 20;
    auto big = rdv.new_communicator("world", "world.shm-big", ranks, opts);
    for (int64_t numel : {int64_t{2}, int64_t{100000}, int64_t{5000000}}) {  // 8 B, 400 KB, 20 MB (> one slot)
      at::Tensor t = sample(numel, at::kFloat, me, 5), w = at::zeros({numel});
      for (int r = 0; r < n; ++r) w += sample(numel, at::kFloat, r, 5);
      big->allreduce(t)->wait();
      expect_eq(t, w, "growing shm allreduce numel " + std::to_string(numel));
      ++checks;
    }
    // Shared buffers (data parallelism's gradient buckets): all-reduced in
    // place, three times over (the claim and done counters carry on), with the
    // last rank arriving 300 ms late once (the others reduce its share), a sum
    // over 9 claim blocks with a ragged tail and a max of 7 doubles. A view of
    // a shared buffer is not the buffer: it takes the staged path.
    at::Tensor grads = big->shared_buffer(600007, at::kFloat), small = big->shared_buffer(7, at::kDouble);
    expect(grads.defined() && small.defined(), "shared_buffer is undefined on a shared-memory group");
    expect(grads.numel() == 600007 && grads.scalar_type() == at::kFloat && small.scalar_type() == at::kDouble,
           "shared_buffer's size or dtype");
    expect(at::equal(grads, at::zeros_like(grads)) && at::equal(small, at::zeros_like(small)), "a new shared buffer is not zero");
    for (int gen = 0; gen < 3; ++gen) {
      grads.copy_(sample(600007, at::kFloat, me, 40 + gen));
      small.copy_(sample(7, at::kDouble, me, 50 + gen));
      at::Tensor want = sample(600007, at::kFloat, 0, 40 + gen), want_max = sample(7, at::kDouble, 0, 50 + gen);
      for (int r = 1; r < n; ++r) {
        want = want + sample(600007, at::kFloat, r, 40 + gen);
        want_max = at::maximum(want_max, sample(7, at::kDouble, r, 50 + gen));
      }
      if (gen == 1 && me == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      auto w1 = big->allreduce(grads), w2 = big->allreduce(small, ReduceOp::Max);
      w2->wait();
      w1->wait();
      expect_eq(grads, want, "shared-buffer allreduce, round " + std::to_string(gen));
      expect_eq(small, want_max, "shared-buffer allreduce max, round " + std::to_string(gen));
      ++checks;
    }
    at::Tensor part = grads.narrow(0, 0, 1000);
    part.copy_(sample(1000, at::kFloat, me, 60));
    at::Tensor want = sample(1000, at::kFloat, 0, 60);
    for (int r = 1; r < n; ++r) want = want + sample(1000, at::kFloat, r, 60);
    big->allreduce(part)->wait();
    expect_eq(part, want, "allreduce of a view of a shared buffer");
    ++checks;
    opts.shm_slot_bytes = 0;
    expect(!gloo->shared_buffer(10, at::kFloat).defined(), "a group without shared memory gave a shared buffer");
  }
  rdv.shutdown(std::chrono::milliseconds(a.timeout_ms));
  std::cout << "rank " << mesh.rank() << ": " << checks << " shm checks passed" << std::endl;
  return 0;
}

// What the transports count as sent, op by op, on 1 MiB tensors over the
// world group, printed per rank as "bytes <transport> <op> sent S analytic A".
// Gloo runs the standard algorithms, so its socket bytes are the analytic
// count plus message headers (checked for the ops where Gloo's algorithm is
// the ring / direct one the count assumes: below). Shared memory is checked
// against its own copies: an all-reduce writes the tensor once, an all-gather
// its input, a reduce-scatter every slice not read in place (all of them on
// group ranks >= 2), a send its message, an all-to-all every slice but its
// own; the shared-buffer all-reduce's blocks
// go to whichever rank claims them, so only the group's sum, (n-1) B, is fixed.
int run_bytes(const Args& a, smp::Rendezvous& rdv, const smp::DeviceMesh& mesh, smp::CommOptions opts) {
  const auto& ranks = mesh.group(smp::Axis::World);
  opts.shm_slot_bytes = int64_t{4} << 20;
  auto shm = rdv.new_communicator("world", "world.bytes-shm", ranks, opts);
  opts.shm_slot_bytes = 0;
  auto gloo = rdv.new_communicator("world", "world.bytes-gloo", ranks, opts);
  const int n = shm->size(), me = shm->rank();
  const int64_t numel = int64_t{1} << 18, B = numel * 4;  // 1 MiB, split evenly over 2 or 4 ranks
  auto sent_of = [](const Communicator& c, const std::string& transport, const std::string& op) {
    const smp::CommStats st = c.stats();
    auto t = st.sent.find(transport);
    if (t == st.sent.end()) return int64_t{0};
    auto o = t->second.find(op);
    return o == t->second.end() ? int64_t{0} : o->second;
  };
  auto analytic_of = [](const Communicator& c, const std::string& op) {
    const smp::CommStats st = c.stats();
    auto o = st.analytic.find(op);
    return o == st.analytic.end() ? int64_t{0} : o->second;
  };
  // Runs f on c and returns (sent by `transport`, analytic) for `op` during it.
  auto measure = [&](Communicator& c, const std::string& transport, const std::string& op, auto&& f) {
    c.reset_stats();
    f();
    const std::pair<int64_t, int64_t> r{sent_of(c, transport, op), analytic_of(c, op)};
    std::cout << "rank " << me << ": bytes " << transport << " " << op << " sent " << r.first << " analytic "
              << r.second << std::endl;
    return r;
  };
  const int peer_to = (me + 1) % n, peer_from = (me + n - 1) % n;
  auto ops = [&](Communicator& c, const std::string& op) {
    at::Tensor t = at::ones({numel}, at::kFloat), out_g = at::empty({numel * n}, at::kFloat);
    at::Tensor out_rs = at::empty({numel / n + (me < numel % n ? 1 : 0)}, at::kFloat);
    if (op == "allreduce") c.allreduce(t)->wait();
    if (op == "allgather") c.allgather(t, out_g)->wait();
    if (op == "reduce_scatter") c.reduce_scatter(t, out_rs)->wait();
    if (op == "alltoall") {
      at::Tensor in = at::ones({n * 1024, 64}, at::kFloat), out = at::empty({n * 1024, 64}, at::kFloat);
      c.alltoall(in, out, {}, {})->wait();
    }
    if (op == "broadcast") c.broadcast(t, 0)->wait();
    if (op == "send") {
      // A ring: even ranks send first, odd ranks receive first (no deadlock on Gloo).
      at::Tensor r = at::empty({numel}, at::kFloat);
      if (me % 2 == 0) {
        c.send(t, peer_to, 7)->wait();
        c.recv(r, peer_from, 7)->wait();
      } else {
        c.recv(r, peer_from, 7)->wait();
        c.send(t, peer_to, 7)->wait();
      }
    }
  };
  int checks = 0;
  // Gloo: the analytic count plus headers, for every op.
  for (const char* op : {"allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "send"}) {
    auto [sent, ana] = measure(*gloo, "gloo", op, [&] { ops(*gloo, op); });
    expect(sent >= ana && sent <= ana + ana / 100 + 65536,
           std::string("gloo ") + op + ": sent " + std::to_string(sent) + " bytes, analytic " + std::to_string(ana));
    ++checks;
  }
  // Shared memory: its own copies, exactly.
  const int64_t own_rs = (numel / n + (me < numel % n ? 1 : 0)) * 4;
  const std::vector<std::pair<const char*, int64_t>> shm_want = {
      {"allreduce", B}, {"allgather", B}, {"reduce_scatter", me <= 1 ? B - own_rs : B}, {"send", B},
      {"alltoall", (n - 1) * 1024 * 64 * 4}};  // every slice but its own
  for (const auto& [op, want] : shm_want) {
    auto [sent, ana] = measure(*shm, "shm", op, [&] { ops(*shm, op); });
    expect(sent == want, std::string("shm ") + op + ": sent " + std::to_string(sent) + " bytes, expected " +
                             std::to_string(want) + " (analytic " + std::to_string(ana) + ")");
    ++checks;
  }
  // Nothing went through Gloo in the shm communicator's all-reduce etc.
  {
    const smp::CommStats st = shm->stats();
    expect(st.sent.count("gloo") == 0, "the shm communicator's collectives wrote nothing into Gloo's sockets");
  }
  // The shared-buffer all-reduce: the group's sum is (n-1) B.
  at::Tensor buf = shm->shared_buffer(numel, at::kFloat);
  buf.fill_(1.0f);
  auto [mine, ana] = measure(*shm, "shm", "allreduce", [&] { shm->allreduce(buf)->wait(); });
  at::Tensor each = at::full({1}, static_cast<double>(mine), at::kDouble), all = at::empty({n}, at::kDouble);
  gloo->allgather(each, all)->wait();
  const int64_t sum = static_cast<int64_t>(all.sum().item<double>());
  expect(sum == (n - 1) * B, "shared-buffer all-reduce: the group wrote " + std::to_string(sum) + " bytes, expected " +
                                 std::to_string((n - 1) * B));
  expect(at::allclose(buf, at::full({numel}, static_cast<float>(n))), "shared-buffer all-reduce result");
  ++checks;
  std::cout << "rank " << me << ": " << checks << " byte checks passed" << std::endl;
  return 0;
}

// Point-to-point through shared memory (ShmMailbox) between world ranks 0 and
// 1, against the same messages over Gloo: dtypes, sizes from 0 elements to one
// larger than the outbox arena (which goes through Gloo, announced), a
// transposed view, tags received in reverse order, and more bytes in flight
// than the arena holds (the rest overflows to Gloo) received last-first.
int run_p2p(const Args& a, smp::Rendezvous& rdv, const smp::DeviceMesh& mesh, smp::CommOptions opts) {
  const auto& ranks = mesh.group(smp::Axis::World);
  opts.shm_slot_bytes = int64_t{1} << 20;  // 1 MiB arenas
  auto shm = rdv.new_communicator("world", "world.p2p-shm", ranks, opts);
  opts.shm_slot_bytes = 0;
  auto gloo = rdv.new_communicator("world", "world.p2p-gloo", ranks, opts);
  const int me = shm->rank();
  expect(shm->transport("send", at::kCPU) == "shm", "send transport is " + shm->transport("send", at::kCPU));
  expect(gloo->transport("send", at::kCPU) == "gloo", "shm_slot_bytes = 0 must mean gloo for send");
  int checks = 0;
  struct Msg {
    int64_t numel;
    at::ScalarType dtype;
  };
  // 0 elements, small, 400 KB, 2 MB (> the 1 MiB arena: through Gloo).
  const std::vector<Msg> msgs = {{0, at::kFloat}, {5, at::kLong},    {17, at::kBFloat16},
                                 {100000, at::kFloat}, {3, at::kDouble}, {500000, at::kFloat}};
  for (auto* comm : {shm.get(), gloo.get()}) {
    if (me == 0) {
      std::vector<std::shared_ptr<smp::Work>> works;
      for (size_t k = 0; k < msgs.size(); ++k)
        works.push_back(comm->send(sample(msgs[k].numel, msgs[k].dtype, 0, static_cast<int>(k)), 1, 100 + static_cast<int>(k)));
      for (auto& w : works) w->wait();
    } else if (me == 1) {
      for (size_t k = msgs.size(); k-- > 0;) {  // newest tag first
        at::Tensor t = at::empty({msgs[k].numel}, at::TensorOptions().dtype(msgs[k].dtype));
        comm->recv(t, 0, 100 + static_cast<int>(k))->wait();
        expect_eq(t, sample(msgs[k].numel, msgs[k].dtype, 0, static_cast<int>(k)),
                  comm->transport("send", at::kCPU) + " p2p message " + std::to_string(k));
        ++checks;
      }
    }
  }
  // A transposed view on both ends (staged through contiguous copies).
  if (me == 0) {
    shm->send(sample(60, at::kFloat, 0, 7).view({6, 10}).t(), 1, 200)->wait();
  } else if (me == 1) {
    at::Tensor base = at::zeros({6, 10}), t = base.t();
    shm->recv(t, 0, 200)->wait();
    expect_eq(base, sample(60, at::kFloat, 0, 7).view({6, 10}), "p2p into a transposed view");
    ++checks;
  }
  // 12 x 256 KB in flight (3 MB > the 1 MiB arena), received last-first, twice
  // (the arena's space comes back and wraps); and the reverse direction.
  for (int round = 0; round < 2; ++round) {
    const int from = round == 0 ? 0 : 1, to = 1 - from;
    if (me == from) {
      std::vector<std::shared_ptr<smp::Work>> works;
      for (int k = 0; k < 12; ++k) works.push_back(shm->send(sample(65536, at::kFloat, from, k), to, 300 + k));
      for (auto& w : works) w->wait();
    } else if (me == to) {
      for (int k = 11; k >= 0; --k) {
        at::Tensor t = at::empty({65536});
        shm->recv(t, from, 300 + k)->wait();
        expect_eq(t, sample(65536, at::kFloat, from, k), "p2p in flight " + std::to_string(k));
      }
      ++checks;
    }
    shm->barrier();
  }
  // The same tag twice: received in the order sent.
  if (me == 0) {
    shm->send(at::full({4}, 1.0), 1, 400)->wait();
    shm->send(at::full({4}, 2.0), 1, 400)->wait();
  } else if (me == 1) {
    at::Tensor x = at::empty({4}), y = at::empty({4});
    shm->recv(x, 0, 400)->wait();
    shm->recv(y, 0, 400)->wait();
    expect_eq(x, at::full({4}, 1.0), "first of a repeated tag");
    expect_eq(y, at::full({4}, 2.0), "second of a repeated tag");
    ++checks;
  }
  rdv.shutdown(std::chrono::milliseconds(a.timeout_ms));
  if (me <= 1) std::cout << "rank " << mesh.rank() << ": " << checks << " p2p checks passed" << std::endl;
  return 0;
}

// Ranks 0 and 1 of a world of 2 (see the top of the file). Prints one line per
// check passed; the hang is the last check and its reports end the run.
int run_rendezvous(const Args& a, smp::Rendezvous& rdv, const smp::DeviceMesh& mesh, smp::CommOptions opts) {
  const auto& ranks = mesh.group(smp::Axis::World);
  const auto host_timeout = std::chrono::milliseconds(a.timeout_ms);
  opts.timeout = host_timeout * 2;  // as ProcessGroups makes them: the host reports first,
  opts.shm_slot_bytes = 0;          // and through Gloo
  auto wrapped = [&](const std::string& name) {
    return smp::with_rendezvous_p2p(rdv.new_communicator("world", name, ranks, opts), host_timeout);
  };
  const int me = mesh.rank();
  auto A = [] { return at::arange(8, at::kFloat); };
  auto B = [] { return at::arange(5, at::kLong) * 3; };
  auto C = [] { return at::full({4}, 2.5); };
  // The order that needs buffered sends, with each direction on its own communicator.
  {
    auto up = wrapped("rdv.up"), down = wrapped("rdv.down");
    if (me == 0) {
      auto a1 = up->send(A(), 1, 1), b1 = up->send(B(), 1, 2);
      at::Tensor c = at::empty({4});
      down->recv(c, 1, 3)->wait();
      expect_eq(c, C(), "C on rank 0");
      a1->wait();
      b1->wait();
    } else {
      at::Tensor x = at::empty({8}), y = at::empty({5}, at::kLong);
      up->recv(x, 0, 1)->wait();
      auto c1 = down->send(C(), 0, 3);
      up->recv(y, 0, 2)->wait();
      expect_eq(x, A(), "A on rank 1");
      expect_eq(y, B(), "B on rank 1");
      c1->wait();
    }
    std::cout << "rank " << me << ": a communicator per direction completes" << std::endl;
  }
  // NCCL pairs the k-th send with the k-th receive, whatever their tags.
  auto mismatch = wrapped("rdv.tags");
  if (me == 0) {
    try {
      mismatch->send(A(), 1, 5)->wait();
      throw CheckFailed("a send of tag 5 completed into a receive of tag 6");
    } catch (const smp::Error& e) {
      std::cout << "rank 0: told of the refusal: " << e.what() << std::endl;
    }
  } else {
    at::Tensor x = at::empty({8});
    try {
      mismatch->recv(x, 0, 6)->wait();
      throw CheckFailed("a receive of tag 6 took the send of tag 5");
    } catch (const smp::Error& e) {
      std::cout << "rank 1: tag mismatch refused: " << e.what() << std::endl;
    }
  }
  // The same order on one communicator: each rank's stream is stuck at a send
  // whose receive is queued behind the other rank's stuck send.
  auto one = wrapped("rdv.one");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    if (me == 0) {
      one->send(A(), 1, 1);
      one->send(B(), 1, 2);
      at::Tensor c = at::empty({4});
      one->recv(c, 1, 3)->wait();
    } else {
      at::Tensor x = at::empty({8}), y = at::empty({5}, at::kLong);
      one->recv(x, 0, 1)->wait();
      one->send(C(), 0, 3);
      one->recv(y, 0, 2)->wait();
    }
    throw CheckFailed("the order completed on one communicator");
  } catch (const smp::Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    std::cout << "rank " << me << ": hang reported after " << ms << " ms: " << e.what() << std::endl;
  }
  // Rank 1 reports before rank 0 goes: a peer that exited would be its error instead.
  if (me == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  std::_Exit(0);  // the stuck streams hold their communicators: no orderly shutdown
}

std::unique_ptr<smp::DeviceMesh> make_mesh(const Args& a, const smp::ProcessEnv& env) {
  int dp = a.dp > 0 ? a.dp : env.world_size / (a.pp * a.tp);
  return std::make_unique<smp::DeviceMesh>(env.world_size, env.rank, a.pp, dp, a.tp, a.order);
}

int run(const Args& a) {
  smp::ProcessEnv env = smp::ProcessEnv::from_environment();
  smp::logging::init(env.rank, env.world_size, a.run_dir, !a.run_dir.empty(), env.rank == 0);
  if (a.mode == "env") {
    std::cout << "RANK=" << env.rank << " WORLD_SIZE=" << env.world_size << " LOCAL_RANK=" << env.local_rank
              << " LOCAL_WORLD_SIZE=" << env.local_world_size << " MASTER_ADDR=" << env.master_addr
              << " MASTER_PORT=" << env.master_port << " SOURCE=" << env.source
              << " OMP_NUM_THREADS=" << (std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "")
              << " CPUS=" << affinity() << std::endl;
    return 0;
  }
  if (a.mode == "fail-once") {
    const char* attempt = std::getenv("SMP_RESTART_COUNT");
    if (env.rank == 1 && attempt && std::string(attempt) == "0") {
      std::cout << "rank 1 failing on purpose (attempt 0)" << std::endl;
      return 5;
    }
  }
  auto rdv = smp::Rendezvous::connect(env.master_addr, env.master_port, env.rank, env.world_size,
                                      std::chrono::milliseconds(a.connect_timeout_ms));
  smp::CommOptions opts;
  opts.timeout = std::chrono::milliseconds(a.timeout_ms);
  if (a.shm_mb >= 0) opts.shm_slot_bytes = static_cast<int64_t>(a.shm_mb * (1 << 20));
  auto mesh = make_mesh(a, env);
  if (a.mode == "shm") return run_shm(a, *rdv, *mesh, opts);
  if (a.mode == "bytes") return run_bytes(a, *rdv, *mesh, opts);
  if (a.mode == "p2p") return run_p2p(a, *rdv, *mesh, opts);
  if (a.mode == "rendezvous") return run_rendezvous(a, *rdv, *mesh, opts);
  if (a.mode == "p2p-mismatch" || a.mode == "p2p-peer-exit") {
    auto world = rdv->new_communicator("world", "world", mesh->group(smp::Axis::World), opts);
    expect(world->transport("send", at::kCPU) == "shm", "expected the shm transport for send");
    // Rank 0 hosts the store: it stays until rank 1 has its outbox mapped
    // (first message and barrier) and, unless it is the one to exit, until
    // rank 1 is done (shutdown).
    if (env.rank == 0) {
      world->send(at::ones({16}), 1, 1)->wait();
      world->barrier();
      if (a.mode == "p2p-peer-exit") {
        std::cout << "rank 0: exiting without the second message" << std::endl;
        std::_Exit(0);
      }
      world->send(at::ones({16}), 1, 2)->wait();
      rdv->shutdown(std::chrono::milliseconds(a.timeout_ms));
      return 0;
    }
    at::Tensor first = at::empty({16});
    world->recv(first, 0, 1)->wait();
    world->barrier();
    at::Tensor second = at::empty({a.mode == "p2p-mismatch" ? 17 : 16});
    const int rc = expect_error("rank " + std::to_string(env.rank), [&] { world->recv(second, 0, 2)->wait(); },
                                "the receive completed");
    if (a.mode == "p2p-mismatch") rdv->shutdown(std::chrono::milliseconds(a.timeout_ms));
    return rc;
  }
  if (a.mode == "shm-mismatch" || a.mode == "shm-peer-exit") {
    auto world = rdv->new_communicator("world", "world", mesh->group(smp::Axis::World), opts);
    expect(world->transport("allreduce", at::kCPU) == "shm", "expected the shm transport");
    at::Tensor t = at::ones({16}, at::kFloat);
    world->allreduce(t)->wait();  // everyone
    if (a.mode == "shm-peer-exit" && env.rank == a.skip_rank) {
      std::cout << "rank " << env.rank << ": exiting without the second allreduce" << std::endl;
      std::_Exit(0);
    }
    at::Tensor u = at::ones({a.mode == "shm-mismatch" ? 16 + env.rank : 16}, at::kFloat);
    return expect_error("rank " + std::to_string(env.rank), [&] { world->allreduce(u)->wait(); },
                        "the allreduce completed");
  }

  if (a.mode == "cuda") {
    // Every collective on CUDA tensors of ranks that share GPU 0 (a one-GPU
    // machine): NCCL refuses that, so "auto" sends them through host memory.
    opts.cuda = true;
    opts.device_key = "localhost/cuda:0";
    const c10::Device dev(c10::kCUDA, 0);
    auto world = rdv->new_communicator("world", "world", mesh->group(smp::Axis::World), opts);
    const int n = world->size(), r = world->rank();
    const std::string how = world->transport("allreduce", dev);
    expect(n == 1 || how.find("through host memory") != std::string::npos, "transport for CUDA tensors: " + how);
    auto on = [&](const at::Tensor& t) { return t.to(dev); };
    auto check = [&](const at::Tensor& got, const at::Tensor& want, const std::string& what) {
      expect(got.is_cuda(), what + ": the result left the GPU");
      expect_eq(got.cpu(), want, what);
    };
    at::Tensor t = on(sample(1000, at::kFloat, r, 1));
    world->allreduce(t)->wait();
    at::Tensor sum = at::zeros({1000}, at::kFloat);
    for (int i = 0; i < n; ++i) sum += sample(1000, at::kFloat, i, 1);
    check(t, sum, "allreduce");
    at::Tensor g = on(at::empty({2 * n, 3}, at::kDouble));
    world->allgather(on(sample(6, at::kDouble, r, 2).view({2, 3})), g)->wait();
    std::vector<at::Tensor> parts;
    for (int i = 0; i < n; ++i) parts.push_back(sample(6, at::kDouble, i, 2).view({2, 3}));
    check(g, at::cat(parts), "allgather");
    at::Tensor rs = on(at::empty({2, 3}, at::kFloat));
    world->reduce_scatter(on(sample(6 * n, at::kFloat, r, 3).view({2 * n, 3})), rs)->wait();
    at::Tensor full = at::zeros({2 * n, 3}, at::kFloat);
    for (int i = 0; i < n; ++i) full += sample(6 * n, at::kFloat, i, 3).view({2 * n, 3});
    check(rs, full.narrow(0, 2 * r, 2), "reduce_scatter");
    at::Tensor a2a = on(at::empty({n, 4}, at::kLong));
    world->alltoall(on(at::full({n, 4}, int64_t{r}, at::kLong) * 10 + at::arange(n, at::kLong).view({n, 1})), a2a, {},
                    {})
        ->wait();
    check(a2a, at::arange(n, at::kLong).view({n, 1}).expand({n, 4}) * 10 + r, "alltoall");
    at::Tensor b = on(sample(7, at::kFloat, r, 4));
    world->broadcast(b, n - 1)->wait();
    check(b, sample(7, at::kFloat, n - 1, 4), "broadcast");
    if (n > 1) {  // a ring of bf16 sends: activations between pipeline stages
      at::Tensor in = on(at::empty({5}, at::kBFloat16));
      auto rw = world->recv(in, (r + n - 1) % n, 3);
      auto sw = world->send(on(sample(5, at::kBFloat16, r, 5)), (r + 1) % n, 3);
      sw->wait();
      rw->wait();
      check(in, sample(5, at::kBFloat16, (r + n - 1) % n, 5), "send/recv");
    }
    rdv->shutdown(std::chrono::milliseconds(a.timeout_ms));
    std::cout << "rank " << env.rank << ": cuda checks passed (" << how << ")" << std::endl;
    return 0;
  }
  if (a.mode == "check") {
    std::unique_ptr<smp::Communicator> world;
    for (smp::Axis axis : {smp::Axis::PP, smp::Axis::DP, smp::Axis::TP, smp::Axis::MP, smp::Axis::World}) {
      auto comm = rdv->new_communicator(smp::axis_name(axis), mesh->group_name(axis), mesh->group(axis), opts);
      if (axis == smp::Axis::World) world = std::move(comm), comm = nullptr;
      smp::Communicator* c = comm ? comm.get() : world.get();
      if (c->size() != mesh->size(axis) || c->global_ranks() != mesh->group(axis) ||
          c->rank() != (axis == smp::Axis::World ? env.rank : mesh->coord(axis)) || c->axis() != smp::axis_name(axis))
        throw CheckFailed(std::string("communicator metadata wrong on axis ") + smp::axis_name(axis));
      if (!c->handle()) throw CheckFailed("null handle");
      Checker(*c, std::string("[") + smp::axis_name(axis) + " " + mesh->group_name(axis) + "]").run();
    }
    // The store's key/value API.
    rdv->set("hello/" + std::to_string(env.rank), "from " + std::to_string(env.rank));
    const int peer = (env.rank + 1) % env.world_size;
    std::string v = rdv->get("hello/" + std::to_string(peer));
    if (v != "from " + std::to_string(peer)) throw CheckFailed("rendezvous get returned '" + v + "'");
    // Rank 0 hosts the store: it waits until everyone is done with it.
    rdv->shutdown(std::chrono::milliseconds(a.timeout_ms));
    spdlog::info("all checks passed");
    std::cout << "rank " << env.rank << ": all checks passed" << std::endl;
    return 0;
  }
  if (a.mode == "allreduce" || a.mode == "fail-once") {
    auto world = rdv->new_communicator("world", "world", mesh->group(smp::Axis::World), opts);
    at::Tensor t = at::arange(10, at::kDouble) + env.rank;
    world->allreduce(t)->wait();
    const double W = env.world_size;
    at::Tensor want = at::arange(10, at::kDouble) * W + W * (W - 1) / 2;
    expect_eq(t, want, "world allreduce");
    std::cout << "rank " << env.rank << ": allreduce ok" << std::endl;
    return 0;
  }
  if (a.mode == "loop") {
    auto world = rdv->new_communicator("world", "world", mesh->group(smp::Axis::World), opts);
    at::Tensor t = at::ones({1024}, at::kFloat);
    world->allreduce(t)->wait();
    if (!a.pid_dir.empty()) {
      std::string tmp = a.pid_dir + "/rank-" + std::to_string(env.rank) + ".pid.tmp";
      std::ofstream(tmp) << ::getpid() << "\n";
      std::rename(tmp.c_str(), (a.pid_dir + "/rank-" + std::to_string(env.rank) + ".pid").c_str());
    }
    for (int i = 0; i < a.steps; ++i) {
      world->allreduce(t)->wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return 0;
  }
  if (a.mode == "timeout") {
    auto tp = rdv->new_communicator("tp", mesh->group_name(smp::Axis::TP), mesh->group(smp::Axis::TP), opts);
    at::Tensor t = at::ones({16}, at::kFloat);
    tp->allreduce(t)->wait();  // everyone
    if (env.rank == a.skip_rank) {
      std::cout << "rank " << env.rank << ": skipping the second allreduce" << std::endl;
      std::this_thread::sleep_for(std::chrono::seconds(120));
      return 0;
    }
    return expect_error("rank " + std::to_string(env.rank), [&] { tp->allreduce(t)->wait(); },
                        "the allreduce completed although rank " + std::to_string(a.skip_rank) + " skipped it");
  }
  throw CheckFailed("unknown --mode " + a.mode);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"smp runtime test worker"};
  app.add_option("--mode", a.mode);
  app.add_option("--pp", a.pp);
  app.add_option("--dp", a.dp);
  app.add_option("--tp", a.tp);
  app.add_option("--order", a.order);
  app.add_option("--timeout-ms", a.timeout_ms);
  app.add_option("--connect-timeout-ms", a.connect_timeout_ms);
  app.add_option("--pid-dir", a.pid_dir);
  app.add_option("--steps", a.steps);
  app.add_option("--skip-rank", a.skip_rank);
  app.add_option("--run-dir", a.run_dir);
  app.add_option("--shm-mb", a.shm_mb);
  CLI11_PARSE(app, argc, argv);
  try {
    return run(a);
  } catch (const CheckFailed& e) {
    std::cerr << "CHECK FAILED: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ERROR: " << e.what() << std::endl;
    return 2;
  }
}
