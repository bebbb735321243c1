// Replays a pipeline Schedule under NCCL's point-to-point rules. See nccl_order.h.
//
// Untimed: only what may run before what. Each rank has a host (its action
// list) and streams holding the ops it posted. The op at the front of a
// stream runs; a send and the receive it matches (the k-th of each on that
// direction) complete together once both run, and leave their streams.
// Nothing else moves a stream, so a state where no host and no stream can
// move is a deadlock. (Groups of ops posted together, as NCCL's group calls
// make them, would be a front of several ops; smp's pipelines need none.)
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
  int group;      // its group's serial number on that stream
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
    std::vector<int> waiting;  // ops whose completion the host waits for
  };
  struct Stream {
    int rank, peer;  // peer -1: every peer (NcclStreams::OnePerRank)
    int direction;   // 1: sends, 0: receives, -1: both
    std::deque<std::vector<int>> groups;
    int popped = 0;  // serial number of the group at the front
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
    streams_.push_back(Stream{rank, key_peer, key_dir, {}, 0});
    return static_cast<int>(streams_.size()) - 1;
  }

  bool advance_host(int r) {
    Host& h = hosts_[r];
    bool moved = false;
    for (;;) {
      if (!h.waiting.empty()) {
        for (int id : h.waiting)
          if (!ops_[id].done) return moved;
        h.waiting.clear();
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
      Stream& st = streams_[k];
      ops_.push_back(PostedOp{r, h.pc, static_cast<int>(seqs.size()), k, st.popped + static_cast<int>(st.groups.size())});
      seqs.push_back(id);
      st.groups.push_back({id});
      if (!send) h.waiting.push_back(id);
      ++h.pc;
      moved = true;
    }
  }

  bool running(const PostedOp& op) const {
    const Stream& st = streams_[op.stream];
    return !st.groups.empty() && op.group == st.popped;
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
    while (!st.groups.empty()) {
      for (int id : st.groups.front()) {
        PostedOp& op = ops_[id];
        if (op.done) continue;
        const int other_id = counterpart(op);
        if (other_id < 0 || !running(ops_[other_id])) continue;
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
        moved = true;
      }
      bool all = true;
      for (int id : st.groups.front()) all = all && ops_[id].done;
      if (!all) break;
      st.groups.pop_front();
      ++st.popped;
      moved = true;
    }
    return moved;
  }

  bool finished() const {
    for (int r = 0; r < s_.stages; ++r)
      if (hosts_[r].pc < s_.actions[r].size() || !hosts_[r].waiting.empty()) return false;
    for (const Stream& st : streams_)
      if (!st.groups.empty()) return false;
    return true;
  }

  static std::string ordinal(int seq) { return "#" + std::to_string(seq + 1); }

  std::string group_text(const std::vector<int>& ids) const {
    std::string out;
    for (int id : ids) out += (out.empty() ? "" : " ") + to_string(action_of(ops_[id]));
    return ids.size() > 1 ? "[" + out + "]" : out;
  }

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
      std::vector<int> open;
      for (int id : h.waiting)
        if (!ops_[id].done) open.push_back(id);
      os << " rank " << r << (open.empty() ? " posted everything" : " waits for " + group_text(open));
      for (const Stream& st : streams_) {
        if (st.rank != r || st.groups.empty()) continue;
        const PostedOp& op = ops_[st.groups.front().front()];
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
        } else if (running(ops_[other])) {
          os << to_string(action_of(ops_[other])) << ", is running)";
        } else {
          const Stream& ost = streams_[ops_[other].stream];
          os << to_string(action_of(ops_[other])) << ", is queued behind " << group_text(ost.groups.front()) << ")";
        }
        if (st.groups.size() > 1) os << " with " << group_text(st.groups[1]) << " behind it";
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
