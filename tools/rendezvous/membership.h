// The elastic rendezvous's decisions, apart from its sockets: who is in the
// job, when a round (a world of nodes, each with its node rank) starts, when
// the running one must stop and re-form, and when the job ends. Events in,
// messages out; time is passed in, so the rules are tested without waiting.
//
// A round forms from the launchers that are ready (joined, or their workers
// stopped): at once when --nnodes MAX are, else MIN settle_s after MIN are (a
// re-formation does not settle: the survivors go on). It stops when an active
// node is lost (its connection closed, or silent past keepalive_s), when one
// reports its workers failed, or when a node waits to join: at the next
// committed checkpoint, or at once with grow_now. Failures with no change of
// membership count against the node whose workers failed first, up to the
// rendezvous's --max-restarts (every node's must be the same); past them the
// node leaves the job. Fewer than MIN ready for join_timeout_s ends the job,
// naming the nodes present.
#pragma once

#include "messages.h"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace smp::rdzv {

struct MembershipOptions {
  int min_nodes = 1, max_nodes = 1;
  double settle_s = 5;         // after MIN are ready, how long a first round waits for more
  double join_timeout_s = 600; // fewer than MIN ready for this long: the job ends
  double keepalive_s = 15;     // a node silent for this long is lost
  int max_restarts = 0;        // failures of one node's workers before it leaves
  bool grow_now = false;       // admit a joining node at once (else at the next checkpoint)
};

struct Outgoing {
  int to;  // a connection id
  Message message;
};

class Membership {
 public:
  explicit Membership(MembershipOptions o) : o_(o) {}

  // The rendezvous opened: the join timeout counts from here.
  void start(double now) { gather_since_ = now; }
  // A connection opened from `addr` (where its node's rank 0 would listen).
  void connected(int id, const std::string& addr, double now) { addresses_[id] = {addr, now}; }
  // A connection's message (hello first; anything else before it is refused).
  std::vector<Outgoing> receive(int id, const Message& m, double now);
  // A connection closed, or its messages refused (`why` says which).
  std::vector<Outgoing> lost(int id, const std::string& why, double now);
  // Time passing: keepalives, settle and join timeouts. Call at least every second.
  std::vector<Outgoing> tick(double now);

  // The server closed the connection: nothing of it is kept (ids are not reused).
  void forget(int id) {
    closed_.erase(id);
    addresses_.erase(id);
  }
  // Set once the job has ended: 0 finished, 1 refused. The server then exits.
  std::optional<int> ended() const { return ended_; }
  // Connections to close (lost, refused, or left after too many failures).
  std::vector<int> take_dropped();
  // What the rendezvous says as it decides (for its log).
  std::vector<std::string> take_log();
  int round() const { return round_; }

 private:
  enum class Phase { Gathering, Running, Stopping, Ended };
  struct Node {
    std::string name, addr;
    int nproc = 0, port = 0;
    bool ready = false, active = false, done = false;
    int node_rank = -1;  // in the round that ran last
    int failures = 0;
    long seq = 0;
    double last_seen = 0;
  };

  std::vector<Outgoing> hello(int id, const Message& m, double now);
  void begin_stop(const std::string& why, std::vector<Outgoing>& out);
  void try_form(double now, std::vector<Outgoing>& out);
  void form(std::vector<int> picked, std::vector<Outgoing>& out);
  void refuse_all(const std::string& why, std::vector<Outgoing>& out);
  void drop(int id, const std::string& why, double now, std::vector<Outgoing>& out);
  void after_stop(double now, std::vector<Outgoing>& out);
  void close_connection(int id);
  bool all_active_ready() const;
  std::string names(const std::vector<int>& ids) const;
  std::vector<int> ready_ids() const;

  MembershipOptions o_;
  std::map<int, Node> nodes_;
  std::map<int, std::pair<std::string, double>> addresses_;  // connections yet to say hello: address, since
  Phase phase_ = Phase::Gathering;
  int round_ = -1;
  int world_ = 0;                 // of the round that ran last
  std::vector<int> last_members_; // its node ids, by node rank
  double gather_since_ = -1;      // when the job began to wait for MIN ready
  double settle_since_ = -1;      // when MIN were first ready
  bool lost_since_stop_ = false;  // a node left while the round stopped
  int failed_node_ = -1;          // the first to report failed workers this round
  std::string job_;               // the first node's job digest: every other's must match
  std::string stop_reason_;
  std::string lost_reason_;       // the first active node lost since the stop, as the round's reason
  long next_seq_ = 0;
  std::optional<int> ended_;
  std::vector<int> dropped_;
  std::set<int> closed_;  // connections closed: nothing more from them is taken
  std::vector<std::string> log_;
};

}  // namespace smp::rdzv
