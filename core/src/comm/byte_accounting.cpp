#include "comm/byte_accounting.h"

#include "base/trace.h"
#include "comm/shm_collectives.h"
#include "comm/shm_mailbox.h"

#include <set>
#include <utility>

namespace smp {

int64_t CommStats::total_analytic() const {
  int64_t t = 0;
  for (const auto& [op, b] : analytic) t += b;
  return t;
}

int64_t split_rows(int64_t rows, int n, int i) { return rows / n + (i < rows % n ? 1 : 0); }

int64_t ring_allreduce_bytes(int64_t numel, int64_t esize, int n, int r) {
  if (n <= 1) return 0;
  auto chunk = [&](int i) { return split_rows(numel, n, i) * esize; };
  return 2 * numel * esize - chunk((r + 1) % n) - chunk((r + 2) % n);
}

int64_t tree_broadcast_bytes(int64_t bytes, int n, int r, int root) {
  const int v = (r - root + n) % n;
  int sends = 0;
  for (int64_t step = 1; step < n; step <<= 1)
    if (v < step && v + step < n) ++sends;
  return sends * bytes;
}

namespace {

constexpr std::pair<ShmCollectives::Kind, const char*> kShmKinds[] = {{ShmCollectives::kAllreduce, "allreduce"},
                                                                      {ShmCollectives::kAllgather, "allgather"},
                                                                      {ShmCollectives::kReduceScatter, "reduce_scatter"},
                                                                      {ShmCollectives::kAlltoall, "alltoall"}};

// What count() noted of the operation this thread is issuing, read by the
// submission of the same call. Per thread: the training thread and helper
// threads (a checkpoint snapshot, a watcher) may issue on one communicator at
// once, and neither may take the other's name or trace tag.
struct Issuing {
  std::string op;
  TraceTag tag;
};
Issuing& issuing() {
  thread_local Issuing current;
  return current;
}

}  // namespace

ByteAccounting::ByteAccounting(const c10d_compat::Backend* gloo, const ShmCollectives* shm, const ShmMailbox* mailbox)
    : gloo_(gloo && gloo->bytes_written() >= 0 ? gloo : nullptr), shm_(shm), mailbox_(mailbox) {}

void ByteAccounting::count(const std::string& op, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.analytic[op] += bytes;
  stats_.calls[op] += 1;
  issuing() = {op, trace::active() ? TraceTag{op, bytes, trace::now_us()} : TraceTag{}};
}

TraceTag ByteAccounting::take_trace_tag() { return std::exchange(issuing().tag, {}); }

void ByteAccounting::before_backend_op(const c10d_compat::Backend& via) {
  std::lock_guard<std::mutex> lock(mu_);
  if (&via == gloo_)
    settle_gloo();
  else
    stats_.uncounted_calls[via.name()][issuing().op] += 1;
}

void ByteAccounting::before_possible_gloo_op() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!gloo_inflight_.empty()) settle_gloo();
}

void ByteAccounting::track_gloo(std::shared_ptr<c10d_compat::PendingWork> work) {
  if (!gloo_ || !work) return;
  std::lock_guard<std::mutex> lock(mu_);
  gloo_inflight_.push_back({issuing().op, std::move(work)});
}

// Gives the bytes written into Gloo's sockets since the last reading to the
// ops in flight since then, and forgets those that have completed (checked
// before the reading, so their last bytes are in it).
void ByteAccounting::settle_gloo() const {
  if (!gloo_) return;
  std::vector<bool> finished;
  for (const auto& f : gloo_inflight_) finished.push_back(f.work->ready());
  const int64_t now = gloo_->bytes_written();
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

CommStats ByteAccounting::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
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

void ByteAccounting::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  settle_gloo();
  stats_ = CommStats{};
  if (shm_)
    for (auto [kind, op] : kShmKinds) shm_base_[kind] = shm_->bytes_written(kind);
  if (mailbox_) mailbox_base_ = mailbox_->bytes_written();
}

}  // namespace smp
