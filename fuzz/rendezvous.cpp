// The elastic rendezvous's input: what launchers (or anyone who can reach its
// port) send it (tools/rendezvous/messages.h: take_lines, decode) and what
// its rules make of it (membership.h). The input is a stream of records, each
// a byte naming the connection (the low 2 bits), a byte of time passing, and
// up to 255 bytes of what that connection sent. Besides the refusals, two
// promises are checked:
// - every message the rendezvous sends is one a launcher takes (decode of its
//   encode does not refuse it), and a round's world is its nodes x ranks;
// - it never sends to a connection it has dropped.
#include "support/fuzz_target.h"

#include "rendezvous/membership.h"

#include <set>

SMP_FUZZ_TARGET(rendezvous) {
  using namespace smp::rdzv;
  MembershipOptions o;
  o.min_nodes = 1, o.max_nodes = 2, o.settle_s = 1, o.join_timeout_s = 30, o.keepalive_s = 5, o.max_restarts = 1;
  if (size > 0 && (data[0] & 0x80)) o.grow_now = true;  // the other way of admitting a node
  Membership m(o);
  m.start(0);
  std::string pending[4];
  std::set<int> gone;  // connections the rendezvous dropped, or whose stream it refused
  double now = 0;
  auto check = [&](const std::vector<Outgoing>& out) {
    for (const Outgoing& g : out) {
      if (gone.count(g.to)) smp::fuzz::finding("sent to connection " + std::to_string(g.to) + " after dropping it");
      try {
        const Message back = decode(encode(g.message));
        if (back.type == "round" && back.world != back.nnodes * back.nproc) smp::fuzz::finding("a round's world");
      } catch (const Refused& e) {
        smp::fuzz::finding(std::string("the rendezvous sent what a launcher refuses: ") + e.what());
      }
    }
    for (int id : m.take_dropped()) gone.insert(id);
    m.take_log();
  };
  for (int id = 0; id < 4; ++id) m.connected(id, "10.0.0." + std::to_string(id + 1), 0);
  size_t i = 0;
  while (i + 3 <= size) {
    const int id = data[i] & 3;
    now += data[i + 1] / 16.0;
    const size_t n = std::min<size_t>(data[i + 2], size - i - 3);
    const char* bytes = reinterpret_cast<const char*>(data + i + 3);
    i += 3 + n;
    check(m.tick(now));
    if (m.ended()) return;
    if (gone.count(id)) continue;
    try {
      for (const std::string& line : take_lines(pending[id], bytes, n)) check(m.receive(id, decode(line), now));
    } catch (const Refused&) {
      check(m.lost(id, "refused", now));  // as the server does: the connection closes
      gone.insert(id);
    }
    if (m.ended()) return;
  }
}
