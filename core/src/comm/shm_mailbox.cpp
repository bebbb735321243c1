#include "comm/shm_mailbox.h"

#include "comm/shm_util.h"
#include "comm/wait.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <vector>

namespace smp {
namespace {

using c10d_compat::Failure;

constexpr int kDescriptors = 256;  // messages in flight per (sender, receiver) before a send waits

enum : uint32_t { kFree = 0, kPosted = 1, kClaimed = 2, kTaken = 3 };

struct Descriptor {  // one cache line
  std::atomic<uint32_t> state;
  int32_t tag;
  int64_t bytes;
  int64_t offset;  // into the arena; -1: the data goes through the c10d backend
  uint64_t seq;    // posting order: equal tags are taken oldest first
};

struct OutboxHeader {  // the segment's first cache line
  shm::WakeWord wake;    // bumped by every post (a waiting receiver sleeps on it) and every take (a waiting sender)
  int32_t pid;           // the sender
  std::atomic<int32_t> receiver_pid;  // set when the receiver maps the outbox; 0 until then
};
static_assert(sizeof(Descriptor) <= shm::kLine && sizeof(OutboxHeader) <= shm::kLine);

int64_t arena_offset() { return shm::round_up(shm::kLine * (1 + kDescriptors), shm::kPage); }

// One mapping of an outbox (sender -> receiver).
struct Mapping {
  char* base = nullptr;
  size_t bytes = 0;
  std::string name;

  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base) munmap(base, bytes);
  }
  OutboxHeader* header() const { return reinterpret_cast<OutboxHeader*>(base); }
  Descriptor* descriptor(int i) const { return reinterpret_cast<Descriptor*>(base + shm::kLine * (1 + i)); }
  char* arena() const { return base + arena_offset(); }
  int64_t arena_bytes() const { return static_cast<int64_t>(bytes) - arena_offset(); }
};

// The sender's side of one outbox: which descriptors and which arena bytes
// are in use. The arena is a ring: blocks are handed out at `head` and come
// back in allocation order from `tail` once the receiver took them.
struct Outbox {
  Mapping map;
  uint64_t next_seq = 0;
  struct Block {
    int descriptor;
    int64_t offset, bytes;
    bool taken = false;
  };
  std::deque<Block> blocks;
  int64_t head = 0, tail = 0;

  void reclaim() {
    for (Block& b : blocks)
      if (!b.taken && map.descriptor(b.descriptor)->state.load(std::memory_order_acquire) == kTaken) {
        b.taken = true;
        map.descriptor(b.descriptor)->state.store(kFree, std::memory_order_relaxed);
      }
    while (!blocks.empty() && blocks.front().taken) blocks.pop_front();
    if (blocks.empty())
      head = tail = 0;
    else
      tail = blocks.front().offset;
  }

  // Offset of `need` free bytes, or -1.
  int64_t allocate(int64_t need) {
    const int64_t size = map.arena_bytes();
    if (need > size) return -1;
    if (blocks.empty() || head >= tail) {  // live bytes are [tail, head)
      if (size - head >= need) return std::exchange(head, head + need);
      if (need < tail) {  // wrap to the start (strictly below tail: head == tail would read as empty)
        head = need;
        return 0;
      }
      return -1;
    }
    if (tail - head > need) return std::exchange(head, head + need);  // wrapped: live [tail, end) + [0, head)
    return -1;
  }

  int free_descriptor() const {
    for (int i = 0; i < kDescriptors; ++i)
      if (map.descriptor(i)->state.load(std::memory_order_relaxed) == kFree) return i;
    return -1;
  }
};

class DoneWork final : public c10d_compat::PendingWork {
 public:
  void wait() override {}
  bool ready() override { return true; }
};

}  // namespace

struct ShmMailbox::Impl {
  std::shared_ptr<c10d_compat::Store> store;
  std::string prefix;
  int rank = 0;
  int64_t arena_bytes = 0;
  std::chrono::milliseconds timeout{0};
  int spins = 0;

  std::mutex mu;
  std::atomic<int64_t> written{0};                  // bytes copied into outboxes
  std::map<int, Outbox> outboxes;                   // by receiver
  std::map<int, std::unique_ptr<Mapping>> inboxes;  // by sender

  ~Impl() {
    for (auto& [peer, o] : outboxes)
      if (!o.map.name.empty()) shm_unlink(o.map.name.c_str());  // the receiver may not have mapped it
  }

  std::string key(int sender, int receiver) const {
    return prefix + "outbox/" + std::to_string(sender) + ">" + std::to_string(receiver);
  }

  Outbox& outbox(int peer) {
    auto it = outboxes.find(peer);
    if (it != outboxes.end()) return it->second;
    Outbox& o = outboxes[peer];
    const size_t total = static_cast<size_t>(arena_offset() + arena_bytes);
    shm::NewSegment made = shm::create_segment("p2p-", total, " for the messages to group rank " + std::to_string(peer));
    shm::Mapped m;
    if (made.fd >= 0) m = shm::map_and_close(made.fd, total, made.name);
    const std::string error = made.fd < 0 ? made.error : m.error;
    if (!error.empty()) {
      if (made.fd >= 0) shm_unlink(made.name.c_str());
      outboxes.erase(peer);
      store->set(key(rank, peer), "!" + error);
      throw Failure(error, false);
    }
    o.map.base = m.base;
    o.map.bytes = m.bytes;
    o.map.name = made.name;
    o.map.header()->pid = getpid();
    store->set(key(rank, peer), made.name);
    return o;
  }

  // The outbox `peer` fills for this rank, mapped on first use. Waits (on the
  // store) for the sender's first send, without holding `mu`.
  const Mapping& inbox(int peer) {
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = inboxes.find(peer);
      if (it != inboxes.end()) return *it->second;
    }
    const std::string name = store->get(key(peer, rank));
    // Its whole size (0): the sender's comm.shm_mb sized it.
    shm::Mapped mapped = shm::open_published(name, 0, peer, "its shared-memory outbox");
    if (name.empty() || name[0] != '!') shm_unlink(name.c_str());  // mapped by both ends now (or never will be)
    if (!mapped.base) throw Failure(mapped.error, false);
    auto m = std::make_unique<Mapping>();
    m->base = mapped.base;
    m->bytes = mapped.bytes;
    m->name = name;
    m->header()->receiver_pid.store(getpid());
    std::lock_guard<std::mutex> lock(mu);
    return *inboxes.emplace(peer, std::move(m)).first->second;
  }
};

ShmMailbox::ShmMailbox(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShmMailbox::~ShmMailbox() = default;

int64_t ShmMailbox::bytes_written() const { return impl_->written.load(); }

std::unique_ptr<ShmMailbox> ShmMailbox::create(std::shared_ptr<c10d_compat::Store> store,
                                               const std::string& key_prefix, int rank, int size, int64_t arena_bytes,
                                               std::chrono::milliseconds timeout) {
  auto impl = std::make_unique<Impl>();
  impl->store = std::move(store);
  impl->prefix = key_prefix;
  impl->rank = rank;
  impl->arena_bytes = shm::round_up(std::max<int64_t>(arena_bytes, shm::kPage), shm::kPage);
  impl->timeout = timeout;
  impl->spins = shm::spins_for_this_host(size);
  return std::unique_ptr<ShmMailbox>(new ShmMailbox(std::move(impl)));
}

std::shared_ptr<c10d_compat::PendingWork> ShmMailbox::send(const at::Tensor& t, int peer, int tag,
                                                          c10d_compat::Backend& backend, bool* went_through_backend) {
  Impl& s = *impl_;
  const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
  bool through_backend = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    Outbox& o = s.outbox(peer);
    o.reclaim();
    int d = o.free_descriptor();
    if (d < 0) {  // kDescriptors messages to this peer not taken yet
      const std::string what = "group rank " + std::to_string(peer) + " to take one of the " +
                               std::to_string(kDescriptors) + " messages this rank sent it before";
      shm::WaitFor w;
      w.word = &o.map.header()->wake;
      w.timeout = s.timeout;
      w.what = what;
      w.missing = [&] { return std::vector<shm::Peer>{{peer, o.map.header()->receiver_pid.load()}}; };
      shm::wait_until(w, [&] {
        o.reclaim();
        return (d = o.free_descriptor()) >= 0;
      });
    }
    Descriptor* desc = o.map.descriptor(d);
    const int64_t offset = o.allocate(shm::round_up(bytes, shm::kLine));
    desc->tag = tag;
    desc->bytes = bytes;
    desc->seq = o.next_seq++;
    desc->offset = offset;
    if (offset >= 0) {
      if (bytes > 0) std::memcpy(o.map.arena() + offset, t.data_ptr(), static_cast<size_t>(bytes));
      s.written += bytes;
      o.blocks.push_back({d, offset, shm::round_up(bytes, shm::kLine)});
    } else {
      through_backend = true;
      o.blocks.push_back({d, o.head, 0});  // holds no arena bytes; frees its descriptor when taken
    }
    desc->state.store(kPosted, std::memory_order_release);
    shm::notify(o.map.header()->wake);
  }
  if (went_through_backend) *went_through_backend = through_backend;
  if (through_backend) {
    at::Tensor keep = t;
    return backend.send(keep, peer, tag);
  }
  return std::make_shared<DoneWork>();
}

namespace {

// Takes the message on wait(), in the waiting thread.
class RecvWork final : public c10d_compat::PendingWork {
 public:
  RecvWork(std::shared_ptr<ShmMailbox::Impl> mailbox, at::Tensor t, int peer, int tag, c10d_compat::Backend& backend)
      : s_(std::move(mailbox)), t_(std::move(t)), peer_(peer), tag_(tag), backend_(backend) {}

  bool ready() override {
    if (done_) return true;
    std::lock_guard<std::mutex> lock(s_->mu);
    auto it = s_->inboxes.find(peer_);
    return it != s_->inboxes.end() && find(*it->second) >= 0;
  }

  void wait() override {
    if (done_) return;
    const Mapping& m = s_->inbox(peer_);
    shm::WaitFor w;
    w.word = &m.header()->wake;
    // A short poll (a find() reads every descriptor) before sleeping, only
    // where the ranks have cores of their own.
    w.spins = std::min(s_->spins, 64);
    w.timeout = s_->timeout;
    const std::string what = "its message (tag " + std::to_string(tag_) + ")";
    w.what = what;
    w.missing = [&] { return std::vector<shm::Peer>{{peer_, m.header()->pid}}; };
    shm::wait_until(w, [&] {
      const int d = find(m);
      return d >= 0 && take(m, d);
    });
  }

 private:
  // The oldest posted descriptor with my tag, or -1.
  int find(const Mapping& m) const {
    int best = -1;
    uint64_t best_seq = 0;
    for (int i = 0; i < kDescriptors; ++i) {
      const Descriptor* d = m.descriptor(i);
      if (d->state.load(std::memory_order_acquire) == kPosted && d->tag == tag_ && (best < 0 || d->seq < best_seq))
        best = i, best_seq = d->seq;
    }
    return best;
  }

  // Claims descriptor i and copies its message into t_; false if another
  // thread claimed it first.
  bool take(const Mapping& m, int i) {
    Descriptor* d = m.descriptor(i);
    uint32_t expected = kPosted;
    if (!d->state.compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel)) return false;
    if (d->tag != tag_) {  // reused for another message between find() and the claim
      d->state.store(kPosted, std::memory_order_release);
      return false;
    }
    const int64_t want = t_.numel() * static_cast<int64_t>(t_.element_size());
    const int64_t bytes = d->bytes, offset = d->offset;
    if (bytes != want) {
      d->state.store(kTaken, std::memory_order_release);
      throw Failure("message tag " + std::to_string(tag_) + " from group rank " + std::to_string(peer_) + " has " +
                        std::to_string(bytes) + " bytes, this receive expects " + std::to_string(want),
                    false);
    }
    if (offset >= 0 && bytes > 0) std::memcpy(t_.data_ptr(), m.arena() + offset, static_cast<size_t>(bytes));
    d->state.store(kTaken, std::memory_order_release);
    shm::notify(m.header()->wake);  // a sender may wait for the descriptor
    if (offset < 0) backend_.recv(t_, peer_, tag_)->wait();  // announced: it went through the backend
    done_ = true;
    return true;
  }

  std::shared_ptr<ShmMailbox::Impl> s_;
  at::Tensor t_;
  int peer_, tag_;
  c10d_compat::Backend& backend_;
  bool done_ = false;
};

}  // namespace

std::shared_ptr<c10d_compat::PendingWork> ShmMailbox::recv(const at::Tensor& t, int peer, int tag,
                                                          c10d_compat::Backend& backend) {
  return std::make_shared<RecvWork>(impl_, t, peer, tag, backend);
}

}  // namespace smp
