#include "membership.h"

#include <algorithm>
#include <climits>
#include <cstdio>

namespace smp::rdzv {

namespace {

Message make(const std::string& type) {
  Message m;
  m.type = type;
  return m;
}

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%g s", s);
  return b;
}

}  // namespace

void Membership::close_connection(int id) {
  dropped_.push_back(id);
  closed_.insert(id);
}

std::vector<int> Membership::take_dropped() { return std::exchange(dropped_, {}); }
std::vector<std::string> Membership::take_log() { return std::exchange(log_, {}); }

std::string Membership::names(const std::vector<int>& ids) const {
  std::string out;
  for (int id : ids) {
    auto it = nodes_.find(id);
    out += (out.empty() ? "" : ", ") + (it == nodes_.end() ? "?" : it->second.name);
  }
  return out.empty() ? "none" : out;
}

std::vector<int> Membership::ready_ids() const {
  std::vector<int> out;
  for (const auto& [id, n] : nodes_)
    if (n.ready) out.push_back(id);
  return out;
}

bool Membership::all_active_ready() const {
  for (const auto& [id, n] : nodes_)
    if (n.active && !n.ready) return false;
  return true;
}

std::vector<Outgoing> Membership::receive(int id, const Message& m, double now) {
  std::vector<Outgoing> out;
  // What a connection sent after the line that closed it (the rest of the
  // same read) is not taken: it would join again under an id about to close.
  if (phase_ == Phase::Ended || closed_.count(id)) return out;
  auto it = nodes_.find(id);
  if (it == nodes_.end()) {
    if (m.type == "hello") return hello(id, m, now);
    Message r = make("refuse");
    r.why = "the rendezvous takes a \"hello\" first, got \"" + m.type + "\"";
    out.push_back({id, r});
    addresses_.erase(id);
    close_connection(id);
    return out;
  }
  Node& n = it->second;
  n.last_seen = now;
  if (m.type == "ping") return out;
  if (m.type == "hello") {
    drop(id, "said hello twice", now, out);
  } else if (m.type == "ready") {
    n.port = m.port;
    if (phase_ == Phase::Running && n.active && !n.ready) {  // its workers ended without a word: as a failure
      if (failed_node_ < 0) failed_node_ = id;
      begin_stop("the workers of " + n.name + " stopped", out);  // marks every active node not ready
    }
    n.ready = true;
    if (phase_ == Phase::Stopping && all_active_ready())
      after_stop(now, out);
    else if (phase_ == Phase::Gathering)
      try_form(now, out);
  } else if (m.type == "committed") {
    if (phase_ == Phase::Running && n.active) {
      int active = 0;
      std::vector<int> waiting;
      for (const auto& [j, k] : nodes_) {
        active += k.active;
        if (!k.active && k.ready) waiting.push_back(j);
      }
      if (!waiting.empty() && active < o_.max_nodes)
        begin_stop(names(waiting) + " joined: admitted at the checkpoint of step " + std::to_string(m.step), out);
    }
  } else if (m.type == "failed") {
    if (phase_ == Phase::Running && n.active && m.round == round_) {
      if (failed_node_ < 0) failed_node_ = id;
      begin_stop("the workers of " + n.name + " failed" + (m.why.empty() ? "" : " (" + m.why + ")"), out);
    }
  } else if (m.type == "done") {
    if (phase_ == Phase::Running && n.active && m.round == round_) {
      n.done = true;
      bool all = true;
      for (const auto& [j, k] : nodes_) all = all && (!k.active || k.done);
      if (all) {
        log_.push_back("round " + std::to_string(round_) + " finished the job");
        for (const auto& [j, k] : nodes_) {
          out.push_back({j, make("finish")});
          close_connection(j);
        }
        nodes_.clear();
        phase_ = Phase::Ended;
        ended_ = 0;
      }
    }
  } else {
    drop(id, "sent \"" + m.type + "\", which launchers do not send", now, out);
  }
  return out;
}

std::vector<Outgoing> Membership::hello(int id, const Message& m, double now) {
  std::vector<Outgoing> out;
  Message r = make("refuse");
  // One job, one set of rules: every launcher's must be the rendezvous's.
  if (m.min_nodes != o_.min_nodes || m.max_nodes != o_.max_nodes)
    r.why = "--nnodes " + std::to_string(m.min_nodes) + ":" + std::to_string(m.max_nodes) + " differs from the job's " +
            std::to_string(o_.min_nodes) + ":" + std::to_string(o_.max_nodes);
  else if (m.max_restarts != o_.max_restarts)
    r.why = "--max-restarts " + std::to_string(m.max_restarts) + " differs from the rendezvous's " +
            std::to_string(o_.max_restarts);
  else if (m.grow_now != o_.grow_now)
    r.why = std::string("--elastic-grow ") + (m.grow_now ? "now" : "checkpoint") + " differs from the rendezvous's";
  else if (!job_.empty() && m.job != job_)
    r.why = "its job (the worker's arguments and job file) differs from the one the other nodes run";
  for (const auto& [j, k] : nodes_)
    if (r.why.empty() && k.nproc != m.nproc)
      r.why = "--nproc-per-node " + std::to_string(m.nproc) + " differs from the job's " + std::to_string(k.nproc) +
              " (node " + k.name + "): every node runs as many ranks";
  if (r.why.empty() && nodes_.size() >= static_cast<size_t>(2 * o_.max_nodes + 8))
    r.why = "the rendezvous already holds " + std::to_string(nodes_.size()) + " nodes for --nnodes " +
            std::to_string(o_.min_nodes) + ":" + std::to_string(o_.max_nodes);
  if (!r.why.empty()) {
    out.push_back({id, r});
    addresses_.erase(id);
    close_connection(id);
    log_.push_back("refused " + m.name + ": " + r.why);
    return out;
  }
  if (job_.empty()) job_ = m.job;
  Node n;
  n.name = m.name;
  for (int k = 2; std::any_of(nodes_.begin(), nodes_.end(), [&](const auto& p) { return p.second.name == n.name; }); ++k)
    n.name = m.name + "#" + std::to_string(k);
  n.addr = addresses_.count(id) ? addresses_[id].first : "127.0.0.1";
  addresses_.erase(id);
  n.nproc = m.nproc;
  n.port = m.port;
  n.ready = true;
  n.seq = next_seq_++;
  n.last_seen = now;
  nodes_[id] = n;
  log_.push_back(n.name + " (" + n.addr + ", " + std::to_string(n.nproc) + " ranks) joined: " +
                 std::to_string(ready_ids().size()) + " ready");
  if (phase_ == Phase::Gathering) {
    if (gather_since_ < 0) gather_since_ = now;
    try_form(now, out);
  } else if (phase_ == Phase::Running) {
    int active = 0;
    for (const auto& [j, k] : nodes_) active += k.active;
    if (active >= o_.max_nodes)
      log_.push_back(n.name + " waits: the job runs on --nnodes MAX = " + std::to_string(o_.max_nodes) + " already");
    else if (o_.grow_now)
      begin_stop(n.name + " joined (--elastic-grow now)", out);
    else
      log_.push_back(n.name + " waits to join at the next committed checkpoint");
  }
  return out;
}

void Membership::begin_stop(const std::string& why, std::vector<Outgoing>& out) {
  if (phase_ != Phase::Running) return;
  phase_ = Phase::Stopping;
  stop_reason_ = why;
  log_.push_back("round " + std::to_string(round_) + " stops: " + why);
  for (auto& [id, n] : nodes_)
    if (n.active) {
      n.ready = false;
      Message s = make("stop");
      s.round = round_;
      s.why = why;
      out.push_back({id, s});
    }
}

void Membership::after_stop(double now, std::vector<Outgoing>& out) {
  phase_ = Phase::Gathering;
  gather_since_ = now;
  try_form(now, out);
}

void Membership::drop(int id, const std::string& why, double now, std::vector<Outgoing>& out) {
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  const Node n = it->second;
  nodes_.erase(it);
  close_connection(id);
  log_.push_back("lost " + n.name + ": " + why);
  if (!n.active) return;
  if (phase_ == Phase::Running) begin_stop("lost node " + n.name + " (" + why + ")", out);
  if (phase_ == Phase::Stopping) {
    lost_since_stop_ = true;
    if (lost_reason_.empty()) lost_reason_ = "lost node " + n.name + " (" + why + ")";
    if (all_active_ready()) after_stop(now, out);
  }
}

std::vector<Outgoing> Membership::lost(int id, const std::string& why, double now) {
  std::vector<Outgoing> out;
  addresses_.erase(id);
  if (phase_ != Phase::Ended && !closed_.count(id)) drop(id, why, now, out);
  closed_.insert(id);
  return out;
}

std::vector<Outgoing> Membership::tick(double now) {
  std::vector<Outgoing> out;
  if (phase_ == Phase::Ended) return out;
  std::vector<std::pair<int, double>> silent;
  for (const auto& [id, n] : nodes_)
    if (now - n.last_seen > o_.keepalive_s) silent.emplace_back(id, now - n.last_seen);
  std::vector<int> mute;  // connected, never said hello: they hold a slot
  for (const auto& [id, a] : addresses_)
    if (now - a.second > o_.keepalive_s) mute.push_back(id);
  for (int id : mute) {
    addresses_.erase(id);
    close_connection(id);
  }
  for (const auto& [id, s] : silent)
    drop(id, "silent for " + seconds(static_cast<int>(s)) + " (keepalive " + seconds(o_.keepalive_s) + ")", now, out);
  if (phase_ == Phase::Gathering) try_form(now, out);
  return out;
}

void Membership::try_form(double now, std::vector<Outgoing>& out) {
  if (phase_ != Phase::Gathering) return;
  std::vector<int> ready = ready_ids();
  const int n = static_cast<int>(ready.size());
  if (n >= o_.max_nodes) return form(ready, out);
  if (n >= o_.min_nodes) {
    if (round_ >= 0) return form(ready, out);  // a re-formation goes on with who is there
    if (settle_since_ < 0) settle_since_ = now;
    if (now - settle_since_ >= o_.settle_s) form(ready, out);
    return;
  }
  settle_since_ = -1;
  if (gather_since_ >= 0 && now - gather_since_ >= o_.join_timeout_s) {
    std::vector<int> present;
    for (const auto& [id, k] : nodes_) present.push_back(id);
    refuse_all("only " + std::to_string(n) + " of the " + std::to_string(o_.min_nodes) + " nodes --nnodes " +
                   std::to_string(o_.min_nodes) + ":" + std::to_string(o_.max_nodes) + " needs " +
                   (round_ < 0 ? "joined" : "were left") + " within " + seconds(o_.join_timeout_s) +
                   " (--rdzv-timeout); present: " + names(present),
               out);
  }
}

void Membership::form(std::vector<int> picked, std::vector<Outgoing>& out) {
  // Failures with no change of membership count against the node that failed first.
  if (round_ >= 0 && failed_node_ >= 0 && !lost_since_stop_ && nodes_.count(failed_node_)) {
    Node& f = nodes_[failed_node_];
    if (++f.failures > o_.max_restarts) {
      Message r = make("refuse");
      r.why = "the workers of " + f.name + " failed " + std::to_string(f.failures) + " times, more than --max-restarts " +
              std::to_string(o_.max_restarts) + ": it leaves the job";
      out.push_back({failed_node_, r});
      const int id = failed_node_;
      failed_node_ = -1;
      picked.erase(std::remove(picked.begin(), picked.end(), id), picked.end());
      nodes_.erase(id);
      close_connection(id);
      log_.push_back(r.why);
      stop_reason_ += "; " + r.why;
      if (static_cast<int>(picked.size()) < o_.min_nodes) {
        if (!picked.empty() || nodes_.empty())
          return refuse_all("fewer than --nnodes MIN = " + std::to_string(o_.min_nodes) + " nodes are left (" +
                                r.why + ")",
                            out);
        return refuse_all(r.why, out);
      }
    }
  }
  auto order = [&](int id) {
    auto it = std::find(last_members_.begin(), last_members_.end(), id);
    return std::make_pair(it == last_members_.end() ? INT_MAX : static_cast<int>(it - last_members_.begin()),
                          nodes_[id].seq);
  };
  std::sort(picked.begin(), picked.end(), [&](int a, int b) { return order(a) < order(b); });
  if (static_cast<int>(picked.size()) > o_.max_nodes) picked.resize(o_.max_nodes);
  const int previous = world_;
  ++round_;
  const Node& master = nodes_[picked[0]];
  const int nproc = master.nproc;
  world_ = nproc * static_cast<int>(picked.size());
  const std::string reason = round_ == 0 ? "start" : lost_reason_.empty() ? stop_reason_ : lost_reason_;
  std::vector<std::string> members;
  for (int id : picked) members.push_back(nodes_[id].name);
  for (auto& [id, n] : nodes_) n.active = false, n.node_rank = -1;
  for (size_t i = 0; i < picked.size(); ++i) {
    Node& n = nodes_[picked[i]];
    n.active = true, n.ready = false, n.done = false, n.node_rank = static_cast<int>(i);
    Message r = make("round");
    r.round = round_, r.node_rank = static_cast<int>(i), r.nnodes = static_cast<int>(picked.size());
    r.nproc = nproc, r.world = world_, r.master_addr = master.addr, r.port = master.port, r.name = n.name;
    r.members = members, r.reason = reason, r.previous_world = previous;
    out.push_back({picked[i], r});
  }
  log_.push_back("round " + std::to_string(round_) + ": world " + std::to_string(world_) + " on " + names(picked) +
                 " (" + reason + ")");
  last_members_ = picked;
  failed_node_ = -1;
  lost_since_stop_ = false;
  lost_reason_.clear();
  settle_since_ = -1;
  gather_since_ = -1;
  phase_ = Phase::Running;
}

void Membership::refuse_all(const std::string& why, std::vector<Outgoing>& out) {
  log_.push_back("the job ends: " + why);
  for (const auto& [id, n] : nodes_) {
    Message r = make("refuse");
    r.why = why;
    out.push_back({id, r});
    close_connection(id);
  }
  nodes_.clear();
  phase_ = Phase::Ended;
  ended_ = 1;
}

}  // namespace smp::rdzv
