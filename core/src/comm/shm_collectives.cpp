#include "comm/shm_collectives.h"

#include "comm/shm_util.h"
#include "comm/store_wait.h"
#include "comm/wait.h"

#include <ATen/Functions.h>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace smp {
namespace {

using c10d_compat::Failure;

using shm::kLine;
using shm::kPage;
using shm::round_up;

constexpr int64_t kMinSlot = 64 * 1024;
// All-reduce reduces my part in blocks this size, so that copying each block's
// result from my slot back to my tensor reads it from L2, not memory.
constexpr int64_t kReduceBlockBytes = 128 * 1024;
// A shared-buffer all-reduce hands out work in blocks this size.
constexpr int64_t kClaimBlockBytes = 256 * 1024;

struct Header {  // the segment's first cache line
  shm::WakeWord wake;  // bumped by every publish; waiters sleep on it
};

struct RankControl {  // one cache line per rank
  std::atomic<uint64_t> progress;  // 3*chunk + {1 ready, 2 reduced (all-reduce only), 3 released}
  int64_t numel;                   // the whole call's input, for the mismatch check
  int32_t dtype;
  int32_t op;
  int32_t kind;                    // ShmCollectives::Kind
  int32_t pid;
};
static_assert(sizeof(Header) <= kLine && sizeof(RankControl) <= kLine);

// out = a (op) b, elementwise; out may be a or b.
void combine(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: at::add_out(out, a, b); return;
    case ReduceOp::Product: at::mul_out(out, a, b); return;
    case ReduceOp::Max: at::maximum_out(out, a, b); return;
    case ReduceOp::Min: at::minimum_out(out, a, b); return;
  }
}

// One mapping of the group's segment: header, n rank controls, n slots.
class Segment {
 public:
  Segment(void* base, size_t bytes, int n, int64_t slot) : base_(static_cast<char*>(base)), bytes_(bytes), n_(n), slot_(slot) {}
  ~Segment() { munmap(base_, bytes_); }
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  static int64_t data_offset(int n) { return round_up(kLine * (1 + n), kPage); }
  static int64_t total_bytes(int n, int64_t slot) { return data_offset(n) + n * slot; }

  Header* header() { return reinterpret_cast<Header*>(base_); }
  RankControl* control(int r) { return reinterpret_cast<RankControl*>(base_ + kLine * (1 + r)); }
  char* slot(int r) { return base_ + data_offset(n_) + r * slot_; }
  int64_t slot_bytes() const { return slot_; }

 private:
  char* base_;
  size_t bytes_;
  int n_;
  int64_t slot_;
};

struct State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;
  bool timed_out = false;
};

class ShmWork final : public c10d_compat::PendingWork {
 public:
  explicit ShmWork(std::shared_ptr<State> s) : s_(std::move(s)) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(s_->mu);
    s_->cv.wait(lock, [&] { return s_->done; });
    if (!s_->error.empty()) throw Failure(s_->error, s_->timed_out);
  }
  bool ready() override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->done;
  }

 private:
  std::shared_ptr<State> s_;
};

constexpr int kAllreduceShared = 4;  // a Task kind beside ShmCollectives::Kind

// One mapping of a shared buffer's segment (a control page, then the data).
struct Mapping {
  char* base = nullptr;
  size_t bytes = 0;
  Mapping(char* b, size_t n) : base(b), bytes(n) {}
  ~Mapping() { munmap(base, bytes); }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

const char* kind_name(int kind) {
  switch (kind) {
    case ShmCollectives::kAllreduce: return "all-reduce";
    case ShmCollectives::kAllgather: return "all-gather";
    case ShmCollectives::kReduceScatter: return "reduce-scatter";
    case ShmCollectives::kAlltoall: return "all-to-all";
    case kAllreduceShared: return "all-reduce of a shared buffer";
  }
  return "?";
}

// What a wait of a task of `kind` waits for (comm/wait.h's failure).
const char* waited_for(int kind) {
  switch (kind) {
    case ShmCollectives::kAllreduce: return "a shared-memory all-reduce";
    case ShmCollectives::kAllgather: return "a shared-memory all-gather";
    case ShmCollectives::kReduceScatter: return "a shared-memory reduce-scatter";
    case ShmCollectives::kAlltoall: return "a shared-memory all-to-all";
    case kAllreduceShared: return "a shared-memory all-reduce of a shared buffer";
  }
  return "a shared-memory collective";
}

}  // namespace

// Rank r's segment: line 0 of its control page holds the generation r last
// marked ready; rank 0's also holds the group's claim and done counters (blocks
// handed out / finished over all generations so far). Data from kPage on.
struct ShmCollectives::SharedBuffer {
  int64_t numel = 0;
  at::ScalarType dtype = at::kFloat;
  size_t segment_bytes = 0;
  std::string key;   // store keys: <key>/name/<r>, <key>/mapped/<r>
  std::vector<std::shared_ptr<Mapping>> maps;  // by group rank
  uint64_t generation = 0;  // all-reduces begun (worker only)

  char* data(int r) const { return maps[r]->base + kPage; }
  std::atomic<uint64_t>* ready(int r) const { return reinterpret_cast<std::atomic<uint64_t>*>(maps[r]->base); }
  std::atomic<uint64_t>* claimed() const { return reinterpret_cast<std::atomic<uint64_t>*>(maps[0]->base + kLine); }
  std::atomic<uint64_t>* done() const { return reinterpret_cast<std::atomic<uint64_t>*>(maps[0]->base + 2 * kLine); }
};

struct ShmCollectives::Task {
  int kind = kAllreduce;
  SharedBuffer* shared = nullptr;  // allreduce_shared
  at::Tensor in, out;  // all-reduce: in is also the result
  ReduceOp op = ReduceOp::Sum;
  std::vector<int64_t> counts;  // reduce-scatter: elements of each rank's slice; all-to-all: of each one I send
  std::vector<int64_t> out_counts;  // all-to-all: elements I receive from each rank
  std::shared_ptr<State> state;
};

struct ShmCollectives::Impl {
  std::shared_ptr<c10d_compat::Store> store;
  std::string prefix;
  int rank = 0, n = 0;
  int64_t max_slot = 0;
  std::chrono::milliseconds timeout{0};
  int spins = 0;

  std::unique_ptr<Segment> seg;  // touched only by the worker, or by the submitter while the worker is idle
  // Shared buffers: appended by the submitting thread (deque: stable addresses
  // for the worker's tasks), looked up under mu.
  std::deque<SharedBuffer> shared;
  int generation = 0;
  uint64_t chunks_done = 0;      // in the current segment

  std::mutex mu;
  std::condition_variable has_task, idle;
  std::deque<Task> queue;
  bool busy = false;
  std::string poisoned;  // the first failure; every later call fails with it
  bool poisoned_timeout = false;
  std::atomic<bool> stop{false};
  std::thread worker;
  // Bytes this rank copied into shared memory for the others to read, by
  // Kind (an all-reduce of a shared buffer counts as an all-reduce).
  std::array<std::atomic<int64_t>, 4> written{};
  void wrote(int kind, int64_t bytes) { written[kind == kAllreduceShared ? kAllreduce : kind] += bytes; }

  const char* waiting_for = "a shared-memory collective";  // the running task's (worker only), for a failed wait

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    has_task.notify_all();
    if (worker.joinable()) worker.join();
  }

  void loop() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu);
        has_task.wait(lock, [&] { return stop || !queue.empty(); });
        if (queue.empty()) return;
        task = std::move(queue.front());
        queue.pop_front();
        busy = true;
      }
      std::string error;
      bool timed_out = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        error = poisoned, timed_out = poisoned_timeout;
      }
      if (error.empty()) {
        try {
          waiting_for = waited_for(task.kind);
          run(task);
        } catch (const Failure& f) {
          error = f.what(), timed_out = f.timed_out();
        } catch (const WaitFailed& f) {
          error = f.what(), timed_out = f.timed_out();
        } catch (const std::exception& e) {
          error = e.what();
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!error.empty() && poisoned.empty()) poisoned = error, poisoned_timeout = timed_out;
        busy = false;
      }
      idle.notify_all();
      {
        std::lock_guard<std::mutex> lock(task.state->mu);
        task.state->done = true;
        task.state->error = error;
        task.state->timed_out = timed_out;
      }
      task.state->cv.notify_all();
    }
  }

  // ---- the protocol (worker thread) ----

  void publish(uint64_t value) {
    seg->control(rank)->progress.store(value);
    shm::notify(seg->header()->wake);
  }

  bool all_reached(uint64_t target) {
    for (int j = 0; j < n; ++j)
      if (seg->control(j)->progress.load(std::memory_order_acquire) < target) return false;
    return true;
  }

  void wait_all(uint64_t target) {
    wait_for([&] { return all_reached(target); },
             [&](int j) { return seg->control(j)->progress.load() < target; });
  }

  // Waits (comm/wait.h) until reached(); late(j) says whether group rank j
  // may be what it waits for (checked for being alive, named on a timeout).
  template <class Reached, class Late>
  void wait_for(Reached&& reached, Late&& late) {
    shm::WaitFor w;
    w.word = &seg->header()->wake;
    w.spins = spins;
    w.timeout = timeout;
    w.what = waiting_for;
    w.missing = [&] {
      std::vector<shm::Peer> peers;
      for (int j = 0; j < n; ++j)
        if (j != rank && late(j)) peers.push_back({j, seg->control(j)->pid});
      return peers;
    };
    w.stop = &stop;
    w.stop_reason = "the communicator was destroyed";
    shm::wait_until(w, reached);
  }

  void run(const Task& task) {
    if (task.kind == kAllreduceShared) return allreduce_shared(task);  // (no task.in: the buffer is the data)
    if (task.kind == kAlltoall) return alltoall(task);
    const int64_t esize = task.in.element_size(), numel = task.in.numel();
    char* in = static_cast<char*>(task.in.data_ptr());
    if (task.kind == kAllreduce) {
      const int64_t per_chunk = seg->slot_bytes() / esize;
      for (int64_t offset = 0; offset < numel; offset += per_chunk)
        allreduce_chunk(in + offset * esize, std::min(per_chunk, numel - offset), task);
    } else if (task.kind == kAllgather) {
      const int64_t per_chunk = seg->slot_bytes() / esize;
      for (int64_t offset = 0; offset < numel; offset += per_chunk)
        allgather_chunk(offset, std::min(per_chunk, numel - offset), task);
    } else {
      // Each slot holds n sub-blocks, one per destination rank.
      const int64_t per_chunk = seg->slot_bytes() / (esize * n);
      const int64_t longest = *std::max_element(task.counts.begin(), task.counts.end());
      for (int64_t offset = 0; offset < longest; offset += per_chunk)
        reduce_scatter_chunk(offset, per_chunk, task);
    }
  }

  // The chunk's progress base; returns once every rank has copied the previous
  // chunk out of my slot, so it may be overwritten.
  uint64_t begin_chunk() {
    const uint64_t base = 3 * chunks_done++;
    wait_all(base);
    return base;
  }

  // Every rank's call must be the same kind, op, dtype and size (an
  // all-to-all's sizes differ: each rank gives its longest slice, and the
  // longest of all is returned).
  int64_t enter(uint64_t base, const Task& task, int64_t numel = -1) {
    RankControl* me = seg->control(rank);
    me->numel = numel >= 0 ? numel : task.in.numel();
    me->dtype = static_cast<int32_t>(task.in.scalar_type());
    me->op = static_cast<int32_t>(task.op);
    me->kind = task.kind;
    publish(base + 1);
    wait_all(base + 1);
    int64_t longest = 0;
    for (int j = 0; j < n; ++j) {
      const RankControl* c = seg->control(j);
      longest = std::max<int64_t>(longest, c->numel);
      if ((c->numel != me->numel && task.kind != kAlltoall) || c->dtype != me->dtype || c->op != me->op ||
          c->kind != me->kind)
        throw Failure(std::string("mismatched collective calls: group rank ") + std::to_string(j) + " called " +
                          kind_name(c->kind) + " with " + std::to_string(c->numel) + " elements of " +
                          c10::toString(static_cast<c10::ScalarType>(c->dtype)) + " (" +
                          to_string(static_cast<ReduceOp>(c->op)) + "), this rank (group rank " + std::to_string(rank) +
                          ") called " + kind_name(task.kind) + " with " + std::to_string(me->numel) +
                          " elements of " + c10::toString(task.in.scalar_type()) + " (" + to_string(task.op) + ")",
                      false);
    }
    return longest;
  }

  // out = part(0) op part(1) op ... in rank order, so every rank computes the same bits.
  static void reduce_in_rank_order(at::Tensor& out, const std::function<at::Tensor(int)>& part, int n, ReduceOp op) {
    combine(out, part(0), part(1), op);
    for (int j = 2; j < n; ++j) combine(out, out, part(j), op);
  }

  // My part of the chunk is read in place from my tensor and reduced into my
  // slot block by block, each block copied back to my tensor while it is still
  // in cache; only the other ranks' parts pass through my slot on the way in
  // and out. For n = 2 that is 4 bytes of memory traffic per byte of gradient
  // instead of 5.5 (whole chunk in, whole chunk out); the probe's timing before
  // and after is in docs/benchmarks.md.
  void allreduce_chunk(char* data, int64_t len, const Task& task) {
    const int64_t esize = task.in.element_size();
    const uint64_t base = begin_chunk();
    auto lo = [&](int i) { return i * (len / n) + std::min<int64_t>(i, len % n); };
    const int64_t begin = lo(rank), end = lo(rank + 1);
    std::memcpy(seg->slot(rank), data, begin * esize);
    std::memcpy(seg->slot(rank) + end * esize, data + end * esize, (len - end) * esize);
    wrote(kAllreduce, len * esize);  // the others' parts now, my reduced part below
    enter(base, task);
    const auto options = at::TensorOptions().dtype(task.in.scalar_type());
    const int64_t block = std::max<int64_t>(1, kReduceBlockBytes / esize);
    for (int64_t b = begin; b < end; b += block) {
      const int64_t count = std::min(block, end - b);
      auto part = [&](int j) { return at::from_blob((j == rank ? data : seg->slot(j)) + b * esize, {count}, options); };
      at::Tensor out = at::from_blob(seg->slot(rank) + b * esize, {count}, options);  // not an input
      reduce_in_rank_order(out, part, n, task.op);
      std::memcpy(data + b * esize, seg->slot(rank) + b * esize, count * esize);
    }
    publish(base + 2);
    wait_all(base + 2);
    for (int j = 0; j < n; ++j) {
      const int64_t b = lo(j), c = lo(j + 1) - b;
      if (j != rank && c > 0) std::memcpy(data + b * esize, seg->slot(j) + b * esize, c * esize);
    }
    publish(base + 3);
  }

  void allreduce_shared(const Task& task) {
    SharedBuffer& b = *task.shared;
    const uint64_t g = ++b.generation;
    const int64_t esize = static_cast<int64_t>(c10::elementSize(b.dtype));
    const int64_t block = std::max<int64_t>(1, kClaimBlockBytes / esize);
    const uint64_t blocks = static_cast<uint64_t>((b.numel + block - 1) / block);
    const uint64_t first = (g - 1) * blocks, last = g * blocks;
    b.ready(rank)->store(g, std::memory_order_release);
    shm::notify(seg->header()->wake);
    auto all_ready = [&] {
      for (int j = 0; j < n; ++j)
        if (b.ready(j)->load(std::memory_order_acquire) < g) return false;
      return true;
    };
    const auto options = at::TensorOptions().dtype(b.dtype);
    at::Tensor acc;
    for (;;) {
      uint64_t c = b.claimed()->load();
      while (c < last && !b.claimed()->compare_exchange_weak(c, c + 1)) {
      }
      if (c >= last) break;
      wait_for(all_ready, [&](int j) { return b.ready(j)->load() < g; });
      const int64_t offset = static_cast<int64_t>(c - first) * block, count = std::min(block, b.numel - offset);
      if (!acc.defined()) acc = at::empty({block}, options);
      at::Tensor out = acc.narrow(0, 0, count);
      reduce_in_rank_order(out, [&](int j) { return at::from_blob(b.data(j) + offset * esize, {count}, options); }, n,
                           task.op);
      for (int j = 0; j < n; ++j) std::memcpy(b.data(j) + offset * esize, out.data_ptr(), count * esize);
      wrote(kAllreduceShared, (n - 1) * count * esize);  // into the other members' buffers
      b.done()->fetch_add(1, std::memory_order_release);
      shm::notify(seg->header()->wake);
    }
    // A claimer that dies leaves its block undone: every other rank may be it.
    wait_for([&] { return b.done()->load(std::memory_order_acquire) >= last; }, [&](int j) { return j != rank; });
  }

  // out holds every rank's input, rank after rank.
  void allgather_chunk(int64_t offset, int64_t len, const Task& task) {
    const int64_t esize = task.in.element_size(), numel = task.in.numel();
    const uint64_t base = begin_chunk();
    std::memcpy(seg->slot(rank), static_cast<const char*>(task.in.data_ptr()) + offset * esize, len * esize);
    wrote(kAllgather, len * esize);
    enter(base, task);
    char* out = static_cast<char*>(task.out.data_ptr());
    for (int j = 0; j < n; ++j) std::memcpy(out + (j * numel + offset) * esize, seg->slot(j), len * esize);
    publish(base + 3);
  }

  // Rank j's slice is in[start_j, start_j + counts[j]); this chunk covers
  // elements [offset, offset + per_chunk) of every slice.
  // My own slice is read in place (not staged through my slot) where that is
  // safe: ranks 0 and 1 read it before or as they write out, which may be that
  // very slice (ZeRO-2/3 reduce into the bucket's own shard).
  void reduce_scatter_chunk(int64_t offset, int64_t per_chunk, const Task& task) {
    const int64_t esize = task.in.element_size();
    const uint64_t base = begin_chunk();
    const char* in = static_cast<const char*>(task.in.data_ptr());
    const bool mine_in_place = rank <= 1;
    int64_t start = 0, my_start = 0;
    for (int j = 0; j < n; ++j) {
      const int64_t len = std::max<int64_t>(0, std::min(per_chunk, task.counts[j] - offset));
      if (j == rank) my_start = start;
      if (len > 0 && !(j == rank && mine_in_place)) {
        std::memcpy(seg->slot(rank) + j * per_chunk * esize, in + (start + offset) * esize, len * esize);
        wrote(kReduceScatter, len * esize);
      }
      start += task.counts[j];
    }
    enter(base, task);
    const int64_t len = std::max<int64_t>(0, std::min(per_chunk, task.counts[rank] - offset));
    if (len > 0) {
      const auto options = at::TensorOptions().dtype(task.in.scalar_type());
      auto part = [&](int j) {
        return at::from_blob(j == rank && mine_in_place ? const_cast<char*>(in) + (my_start + offset) * esize
                                                        : seg->slot(j) + rank * per_chunk * esize,
                             {len}, options);
      };
      at::Tensor out = task.out.view({-1}).narrow(0, offset, len);
      reduce_in_rank_order(out, part, n, task.op);
    }
    publish(base + 3);
  }

  // Slices start where the ones before them end; chunk c covers elements
  // [c per_chunk, (c + 1) per_chunk) of every slice, for as many chunks as
  // the longest slice of any rank needs.
  void alltoall(const Task& task) {
    const int64_t esize = task.in.element_size(), per_chunk = seg->slot_bytes() / (esize * n);
    const char* in = static_cast<const char*>(task.in.data_ptr());
    char* out = static_cast<char*>(task.out.data_ptr());
    std::vector<int64_t> in_start(n, 0), out_start(n, 0);
    int64_t mine = 0;
    for (int j = 0; j < n; ++j) {
      if (j > 0) in_start[j] = in_start[j - 1] + task.counts[j - 1], out_start[j] = out_start[j - 1] + task.out_counts[j - 1];
      if (j != rank) mine = std::max({mine, task.counts[j], task.out_counts[j]});
    }
    if (task.counts[rank] != task.out_counts[rank])
      throw Failure("all-to-all: this rank sends itself " + std::to_string(task.counts[rank]) + " elements but expects " +
                        std::to_string(task.out_counts[rank]),
                    false);
    std::memcpy(out + out_start[rank] * esize, in + in_start[rank] * esize, task.counts[rank] * esize);
    const auto part = [&](int64_t count, int64_t offset) { return std::max<int64_t>(0, std::min(per_chunk, count - offset)); };
    for (int64_t offset = 0;; offset += per_chunk) {
      const uint64_t base = begin_chunk();
      for (int d = 0; d < n; ++d) {
        const int64_t len = part(task.counts[d], offset);
        if (d == rank || len == 0) continue;
        std::memcpy(seg->slot(rank) + d * per_chunk * esize, in + (in_start[d] + offset) * esize, len * esize);
        wrote(kAlltoall, len * esize);
      }
      const int64_t longest = enter(base, task, mine);
      for (int j = 0; j < n; ++j) {
        const int64_t len = part(task.out_counts[j], offset);
        if (j != rank && len > 0)
          std::memcpy(out + (out_start[j] + offset) * esize, seg->slot(j) + rank * per_chunk * esize, len * esize);
      }
      publish(base + 3);
      if (offset + per_chunk >= longest) break;
    }
  }

  // Maps every other rank's segment of a shared buffer, then unlinks this
  // rank's own once every other rank has mapped it (as map_segment does): from
  // then on nothing is left in /dev/shm whatever happens to the processes.
  void map_peers(SharedBuffer& b) {
    for (int j = 0; j < n; ++j) {
      if (j == rank) continue;
      shm::Mapped m = shm::open_published(store->get(b.key + "/name/" + std::to_string(j)), b.segment_bytes, j,
                                          "its shared buffer");
      if (!m.base) throw Failure(m.error, false);
      b.maps[j] = std::make_shared<Mapping>(m.base, m.bytes);
      arrive(*store, b.key + "/mapped/" + std::to_string(j), rank);
    }
    arrive(*store, b.key + "/mapped/" + std::to_string(rank), rank);  // (so that only the others can be missing)
    wait_for_arrivals(*store, b.key + "/mapped/" + std::to_string(rank), n, timeout,
                      "every group rank to map this rank's shared buffer", "group rank");
  }

  // ---- segment (re)creation (submitting thread, worker idle, all ranks at the same call) ----

  void map_segment(int64_t slot) {
    const std::string key = prefix + "segment/" + std::to_string(++generation);
    const size_t total = static_cast<size_t>(Segment::total_bytes(n, slot));
    std::string name;
    shm::Mapped m;
    if (rank == 0) {
      // The name only has to be new: the others learn it from the store.
      shm::NewSegment made = shm::create_segment("", total);
      if (made.fd >= 0) m = shm::map_and_close(made.fd, total, made.name);
      const std::string error = made.fd < 0 ? made.error : m.error;
      if (!error.empty()) {
        if (made.fd >= 0) shm_unlink(made.name.c_str());
        store->set(key, "!" + error);
        throw Failure(error, false);
      }
      name = made.name;
      store->set(key, name);
    } else {
      m = shm::open_published(store->get(key), total, 0, "the shared-memory segment");
      if (!m.base) throw Failure(m.error, false);
    }
    seg = std::make_unique<Segment>(m.base, total, n, slot);
    chunks_done = 0;
    seg->control(rank)->pid = getpid();
    arrive(*store, key + "/mapped", rank);
    if (rank == 0) {
      // Unlink once everyone has it mapped: the memory then lives exactly as long as the mappings.
      try {
        wait_for_arrivals(*store, key + "/mapped", n, timeout, "every group rank to map the shared-memory segment",
                          "group rank");
      } catch (...) {
        shm_unlink(name.c_str());
        throw;
      }
      shm_unlink(name.c_str());
    }
  }

  void grow_to(int64_t bytes) {
    int64_t slot = kMinSlot;
    while (slot < bytes && slot < max_slot) slot *= 2;
    slot = std::min(slot, max_slot);
    if (seg && slot <= seg->slot_bytes()) return;
    {
      std::unique_lock<std::mutex> lock(mu);
      idle.wait(lock, [&] { return queue.empty() && !busy; });
      if (!poisoned.empty()) return;  // the call fails with it below
    }
    try {
      map_segment(slot);
    } catch (const Failure& f) {
      std::lock_guard<std::mutex> lock(mu);
      poisoned = f.what(), poisoned_timeout = f.timed_out();
    } catch (const WaitFailed& f) {
      std::lock_guard<std::mutex> lock(mu);
      poisoned = f.what(), poisoned_timeout = f.timed_out();
    }
  }
};

ShmCollectives::ShmCollectives(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  impl_->worker = std::thread([i = impl_.get()] { i->loop(); });
}

ShmCollectives::~ShmCollectives() = default;

std::unique_ptr<ShmCollectives> ShmCollectives::create(std::shared_ptr<c10d_compat::Store> store,
                                                   const std::string& key_prefix, int rank, int size,
                                                   int64_t max_slot_bytes, std::chrono::milliseconds timeout) {
  const std::string mine = shm::host_identity();
  store->set(key_prefix + "host/" + std::to_string(rank), mine);
  bool same = !mine.empty();
  for (int j = 0; j < size; ++j)
    if (j != rank && store->get(key_prefix + "host/" + std::to_string(j)) != mine) same = false;
  if (!same) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->store = std::move(store);
  impl->prefix = key_prefix;
  impl->rank = rank;
  impl->n = size;
  impl->max_slot = round_up(std::max<int64_t>(max_slot_bytes, kPage), kPage);
  impl->timeout = timeout;
  impl->spins = shm::spins_for_this_host(size);
  return std::unique_ptr<ShmCollectives>(new ShmCollectives(std::move(impl)));
}

std::shared_ptr<c10d_compat::PendingWork> ShmCollectives::submit(Task task, int64_t slot_bytes_wanted) {
  Impl& s = *impl_;
  task.state = std::make_shared<State>();
  auto work = std::make_shared<ShmWork>(task.state);
  s.grow_to(slot_bytes_wanted);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.queue.push_back(std::move(task));
  }
  s.has_task.notify_one();
  return work;
}

std::shared_ptr<c10d_compat::PendingWork> ShmCollectives::allreduce(const at::Tensor& t, ReduceOp op) {
  Task task;
  task.kind = kAllreduce;
  task.in = t;
  task.op = op;
  return submit(std::move(task), t.numel() * static_cast<int64_t>(t.element_size()));
}

at::Tensor ShmCollectives::shared_buffer(int64_t numel, at::ScalarType dtype) {
  Impl& s = *impl_;
  SharedBuffer* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.shared.emplace_back();
    b = &s.shared.back();
    b->key = s.prefix + "shared/" + std::to_string(s.shared.size() - 1);
  }
  b->numel = numel;
  b->dtype = dtype;
  b->segment_bytes = static_cast<size_t>(kPage + round_up(std::max<int64_t>(1, numel * static_cast<int64_t>(c10::elementSize(dtype))), kPage));
  const std::string name_key = b->key + "/name/" + std::to_string(s.rank);
  shm::NewSegment made = shm::create_segment("buf", b->segment_bytes, " for a shared gradient buffer");
  shm::Mapped m;
  if (made.fd >= 0) m = shm::map_and_close(made.fd, b->segment_bytes, made.name);
  const std::string error = made.fd < 0 ? made.error : m.error;
  if (!error.empty()) {
    if (made.fd >= 0) shm_unlink(made.name.c_str());
    s.store->set(name_key, "!" + error);  // the others fail too, not wait
    throw Failure(error, false);
  }
  b->maps.resize(s.n);
  b->maps[s.rank] = std::make_shared<Mapping>(m.base, m.bytes);
  s.store->set(name_key, made.name);
  try {
    s.map_peers(*b);
  } catch (...) {
    shm_unlink(made.name.c_str());
    throw;
  }
  shm_unlink(made.name.c_str());
  std::shared_ptr<Mapping> keep = b->maps[s.rank];
  return at::from_blob(b->data(s.rank), {numel}, [keep](void*) {}, at::TensorOptions().dtype(dtype));
}

int ShmCollectives::shared_buffer_index(const at::Tensor& t) const {
  Impl& s = *impl_;
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous()) return -1;
  std::lock_guard<std::mutex> lock(s.mu);
  for (size_t i = 0; i < s.shared.size(); ++i) {
    const SharedBuffer& b = s.shared[i];
    if (t.data_ptr() == b.data(s.rank) && t.numel() == b.numel && t.scalar_type() == b.dtype) return static_cast<int>(i);
  }
  return -1;
}

int64_t ShmCollectives::bytes_written(Kind kind) const { return impl_->written[kind].load(); }

std::shared_ptr<c10d_compat::PendingWork> ShmCollectives::allreduce_shared(int index, ReduceOp op) {
  Task task;
  task.kind = kAllreduceShared;
  task.op = op;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    task.shared = &impl_->shared.at(static_cast<size_t>(index));
  }
  return submit(std::move(task), kMinSlot);  // (the segment's header carries the wake-ups)
}

std::shared_ptr<c10d_compat::PendingWork> ShmCollectives::allgather(const at::Tensor& in, const at::Tensor& out) {
  Task task;
  task.kind = kAllgather;
  task.in = in;
  task.out = out;
  return submit(std::move(task), in.numel() * static_cast<int64_t>(in.element_size()));
}

std::shared_ptr<c10d_compat::PendingWork> ShmCollectives::alltoall(const at::Tensor& in, const at::Tensor& out,
                                                                   std::vector<int64_t> in_counts,
                                                                   std::vector<int64_t> out_counts) {
  Task task;
  task.kind = kAlltoall;
  task.in = in;
  task.out = out;
  task.counts = std::move(in_counts);
  task.out_counts = std::move(out_counts);
  // Ranks' slices differ, and a slot grows only at the same call on every
  // rank with the same wish: every all-to-all wishes for the same (a few
  // MiB, so that a MoE layer's rows take few rounds), the chunks follow.
  return submit(std::move(task), int64_t{4} << 20);
}

std::shared_ptr<c10d_compat::PendingWork> ShmCollectives::reduce_scatter(const at::Tensor& in, const at::Tensor& out,
                                                                         std::vector<int64_t> counts, ReduceOp op) {
  Task task;
  task.kind = kReduceScatter;
  task.in = in;
  task.out = out;
  task.op = op;
  const int64_t longest = counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
  task.counts = std::move(counts);
  return submit(std::move(task), longest * impl_->n * static_cast<int64_t>(in.element_size()));
}

}  // namespace smp
