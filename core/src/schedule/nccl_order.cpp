// Replays a pipeline Schedule under NCCL's point-to-point rules. See nccl_order.h.
//
// Untimed: only what may run before what. Each rank has a host (its action
// list) and streams holding the ops it posted. The op at the front of a
// stream runs; a send and the receive it matches (the k-th of each on that
// direction) complete together once both run, and leave their streams.
// Nothing else moves a stream, so a state where no host and no stream can
// move is a deadlock. (NCCL's group calls, several ops running as one, are
// not modelled: smp's pipelines post none.)
#include "schedule/nccl_order.h"

#include <deque>
#include <map>
#include <sstream>
#include <tuple>
#include <vector>

namespace smp {
namespace {

struct PostedOp {
  int rank;
  size_t action;  // index in the rank's action list
  int seq;        // its place among the sends (receives) of its direction
  int stream;     // index into streams_
  bool done = false;
};

class NcclReplay {
 public:
  NcclReplay(const Schedule& s, NcclStreams model) : s_(s), model_(model), hosts_(s.stages) {}

  std::string run() {
    for (;;) {
      bool moved = false;
      for (int r = 0; r < s_.stages; ++r) moved = advance_host(r) || moved;
      for (size_t k = 0; k < streams_.size(); ++k) moved = advance_stream(k) || moved;
      if (!mismatch_.empty()) return mismatch_;
      if (finished()) return "";
      if (!moved) return deadlock();
    }
  }

 private:
  struct Host {
    size_t pc = 0;
    int waiting = -1;  // the receive whose completion the host waits for; -1: none
  };
  struct Stream {
    int rank, peer;  // peer -1: every peer (NcclStreams::OnePerRank)
    int direction;   // 1: sends, 0: receives, -1: both
    std::deque<int> ops;  // the front one runs
  };

  const Action& action_of(const PostedOp& op) const { return s_.actions[op.rank][op.action]; }
  static bool is_send(Op op) { return op == Op::SendActivation || op == Op::SendGrad; }

  // The message a comm action carries: (kind, microbatch, virtual stage of its producer).
  std::tuple<int, int, int> message(int rank, const Action& a) const {
    const int vs = s_.virtual_stage(rank, a.chunk);
    switch (a.op) {
      case Op::SendActivation: return {0, a.microbatch, vs};
      case Op::RecvActivation: return {0, a.microbatch, vs - 1};
      case Op::SendGrad: return {1, a.microbatch, vs};
      default: return {1, a.microbatch, vs + 1};  // RecvGrad
    }
  }

  int stream_of(int rank, int peer, bool send) {
    if (model_ == NcclStreams::OnePerGroup) {
      // The group of a message going up (to a higher rank) or down; peer -2
      // marks the up group's stream, -3 the down group's.
      const bool up = send ? peer > rank : peer < rank;
      return stream_keyed(rank, up ? -2 : -3, -1);
    }
    const int key_peer = model_ == NcclStreams::OnePerRank ? -1 : peer;
    const int key_dir = model_ == NcclStreams::OnePerDirection ? (send ? 1 : 0) : -1;
    return stream_keyed(rank, key_peer, key_dir);
  }

  int stream_keyed(int rank, int key_peer, int key_dir) {
    for (size_t k = 0; k < streams_.size(); ++k)
      if (streams_[k].rank == rank && streams_[k].peer == key_peer && streams_[k].direction == key_dir)
        return static_cast<int>(k);
    streams_.push_back(Stream{rank, key_peer, key_dir, {}});
    return static_cast<int>(streams_.size()) - 1;
  }

  bool advance_host(int r) {
    Host& h = hosts_[r];
    bool moved = false;
    for (;;) {
      if (h.waiting >= 0) {
        if (!ops_[h.waiting].done) return moved;
        h.waiting = -1;
        moved = true;
      }
      const auto& acts = s_.actions[r];
      if (h.pc >= acts.size()) return moved;
      if (is_compute(acts[h.pc].op)) {
        ++h.pc;
        moved = true;
        continue;
      }
      const Action& a = acts[h.pc];
      const bool send = is_send(a.op);
      const auto dir = send ? std::make_pair(r, a.peer) : std::make_pair(a.peer, r);
      auto& seqs = send ? sends_[dir] : recvs_[dir];
      const int id = static_cast<int>(ops_.size());
      const int k = stream_of(r, a.peer, send);
      ops_.push_back(PostedOp{r, h.pc, static_cast<int>(seqs.size()), k});
      seqs.push_back(id);
      streams_[k].ops.push_back(id);
      if (!send) h.waiting = id;
      ++h.pc;
      moved = true;
    }
  }

  bool running(int id) const {
    const Stream& st = streams_[ops_[id].stream];
    return !st.ops.empty() && st.ops.front() == id;
  }

  // The op on the other side of `op` (same direction, same place), or -1 if not posted yet.
  int counterpart(const PostedOp& op) const {
    const Action& a = action_of(op);
    const bool send = is_send(a.op);
    const auto dir = send ? std::make_pair(op.rank, a.peer) : std::make_pair(a.peer, op.rank);
    const auto& other = send ? recvs_ : sends_;
    auto it = other.find(dir);
    if (it == other.end() || static_cast<int>(it->second.size()) <= op.seq) return -1;
    return it->second[op.seq];
  }

  bool advance_stream(size_t k) {
    Stream& st = streams_[k];
    bool moved = false;
    while (!st.ops.empty()) {
      PostedOp& op = ops_[st.ops.front()];
      if (!op.done) {  // its counterpart may have completed it from the other stream
        const int other_id = counterpart(op);
        if (other_id < 0 || !running(other_id)) break;
        PostedOp& other = ops_[other_id];
        if (message(op.rank, action_of(op)) != message(other.rank, action_of(other))) {
          std::ostringstream os;
          const PostedOp& snd = is_send(action_of(op).op) ? op : other;
          const PostedOp& rcv = is_send(action_of(op).op) ? other : op;
          os << "NCCL would match rank " << snd.rank << "'s " << to_string(action_of(snd)) << " with rank "
             << rcv.rank << "'s " << to_string(action_of(rcv)) << " (both the " << ordinal(snd.seq)
             << " on their direction), another message";
          mismatch_ = os.str();
          return true;
        }
        op.done = other.done = true;
      }
      st.ops.pop_front();
      moved = true;
    }
    return moved;
  }

  bool finished() const {
    for (int r = 0; r < s_.stages; ++r)
      if (hosts_[r].pc < s_.actions[r].size() || hosts_[r].waiting >= 0) return false;
    for (const Stream& st : streams_)
      if (!st.ops.empty()) return false;
    return true;
  }

  static std::string ordinal(int seq) { return "#" + std::to_string(seq + 1); }

  std::string text(int id) const { return to_string(action_of(ops_[id])); }

  std::string deadlock() const {
    std::ostringstream os;
    os << "deadlock under NCCL's rules (rendezvous sends, "
       << (model_ == NcclStreams::OnePerPair    ? "a stream per pair of ranks"
           : model_ == NcclStreams::OnePerRank  ? "one stream per rank"
           : model_ == NcclStreams::OnePerGroup ? "a stream per rank and group"
                                                : "a stream per pair and direction")
       << "):";
    for (int r = 0; r < s_.stages; ++r) {
      const Host& h = hosts_[r];
      const bool waits = h.waiting >= 0 && !ops_[h.waiting].done;
      os << " rank " << r << (waits ? " waits for " + text(h.waiting) : " posted everything");
      for (const Stream& st : streams_) {
        if (st.rank != r || st.ops.empty()) continue;
        const PostedOp& op = ops_[st.ops.front()];
        const Action& a = action_of(op);
        const int other = counterpart(op);
        const std::string peer = std::to_string(st.peer);
        os << ", its stream"
           << (st.peer == -2          ? " of the up group"
               : st.peer == -3        ? " of the down group"
               : st.peer < 0          ? std::string()
               : st.direction == 1 ? " of sends to rank " + peer
               : st.direction == 0 ? " of receives from rank " + peer
                                   : " with rank " + peer)
           << " is stuck at " << to_string(a) << " (rank " << a.peer << "'s "
           << (is_send(a.op) ? "receive " + ordinal(op.seq) + " from" : "send " + ordinal(op.seq) + " to") << " rank " << r
           << ", ";
        if (other < 0) {
          os << "not posted)";
        } else if (running(other)) {
          os << text(other) << ", is running)";
        } else {
          os << text(other) << ", is queued behind " << text(streams_[ops_[other].stream].ops.front()) << ")";
        }
        if (st.ops.size() > 1) os << " with " << text(st.ops[1]) << " behind it";
      }
      os << ';';
    }
    return os.str();
  }

  const Schedule& s_;
  NcclStreams model_;
  std::vector<Host> hosts_;
  std::vector<Stream> streams_;
  std::vector<PostedOp> ops_;
  std::map<std::pair<int, int>, std::vector<int>> sends_, recvs_;  // by (src, dst): ops in posted order
  std::string mismatch_;
};

}  // namespace

std::string check_nccl_order(const Schedule& schedule, NcclStreams streams) {
  return NcclReplay(schedule, streams).run();
}

}  // namespace smp
