// Event simulation of pipeline schedules. See schedule_simulator.h.
#include "schedule/schedule_simulator.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <sstream>
#include <tuple>

namespace smp {
namespace {

enum class BwdState { None, Full, Input, InputWeight };

struct Message {
  int microbatch;
  int src_virtual_stage;
  double available;
};

enum Kind { kAct = 0, kGrad = 1 };

struct RankState {
  size_t pc = 0;
  double time = 0;
  double busy = 0;
  std::vector<SimSlice> timeline;
  int in_flight = 0;
  int peak = 0;
  // per (microbatch, chunk)
  std::vector<std::vector<bool>> forwarded, act_received, grad_received;
  std::vector<std::vector<BwdState>> bwd;
};

struct Fail {
  std::string message;
};

class Simulator {
 public:
  Simulator(const Schedule& s, const SimCosts& c) : s_(s), c_(c) {}

  SimResult run() {
    SimResult res;
    try {
      check_shape();
      init();
      loop();
      check_complete();
      // The executor's streams (nccl_order.h): a stream per direction of a
      // pair (c10d's send/recv on two groups) or per group (the groups
      // connected at start, LibTorch >= 2.3).
      for (NcclStreams model : {NcclStreams::OnePerDirection, NcclStreams::OnePerGroup}) {
        const std::string nccl = check_nccl_order(s_, model);
        if (!nccl.empty()) fail(nccl);
      }
      res.ok = true;
    } catch (const Fail& f) {
      res.ok = false;
      res.error = "schedule '" + s_.name + "': " + f.message;
    }
    fill_stats(res);
    return res;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) { throw Fail{msg}; }

  std::string where(int r, size_t pc) const {
    std::ostringstream os;
    os << "rank " << r << " action #" << pc << " (" << to_string(s_.actions[r][pc]) << ")";
    return os.str();
  }

  void check_shape() {
    if (s_.stages < 1 || s_.microbatches < 1 || s_.chunks < 1)
      fail("stages, microbatches and chunks must be >= 1");
    if (static_cast<int>(s_.actions.size()) != s_.stages)
      fail("has " + std::to_string(s_.actions.size()) + " action lists for " + std::to_string(s_.stages) +
           " stages");
    for (int r = 0; r < s_.stages; ++r) {
      for (size_t i = 0; i < s_.actions[r].size(); ++i) {
        const Action& a = s_.actions[r][i];
        if (a.microbatch < 0 || a.microbatch >= s_.microbatches)
          fail(where(r, i) + ": microbatch out of range [0, " + std::to_string(s_.microbatches) + ")");
        if (a.chunk < 0 || a.chunk >= s_.chunks)
          fail(where(r, i) + ": chunk out of range [0, " + std::to_string(s_.chunks) + ")");
        if (is_comm(a.op) && (a.peer < 0 || a.peer >= s_.stages))
          fail(where(r, i) + ": peer out of range [0, " + std::to_string(s_.stages) + ")");
      }
    }
  }

  void init() {
    const int p = s_.stages, M = s_.microbatches, v = s_.chunks;
    ranks_.assign(p, RankState{});
    for (auto& st : ranks_) {
      st.forwarded.assign(M, std::vector<bool>(v, false));
      st.act_received = st.forwarded;
      st.grad_received = st.forwarded;
      st.bwd.assign(M, std::vector<BwdState>(v, BwdState::None));
    }
  }

  // Runs rank r until it blocks on a receive or finishes. Returns true if it advanced.
  bool advance(int r) {
    RankState& st = ranks_[r];
    bool progressed = false;
    while (st.pc < s_.actions[r].size()) {
      if (!step(r, st)) break;
      ++st.pc;
      progressed = true;
    }
    return progressed;
  }

  // Executes the current action of rank r; false when it is a receive that must wait.
  bool step(int r, RankState& st) {
    const Action& a = s_.actions[r][st.pc];
    const int S = s_.num_virtual_stages();
    const int vs = s_.virtual_stage(r, a.chunk);
    const int m = a.microbatch, c = a.chunk;
    switch (a.op) {
      case Op::Forward: {
        if (st.forwarded[m][c]) fail(where(r, st.pc) + ": microbatch forwarded twice");
        if (vs > 0 && !st.act_received[m][c])
          fail(where(r, st.pc) + ": forward on virtual stage " + std::to_string(vs) +
               " before its activation was received from virtual stage " + std::to_string(vs - 1));
        st.forwarded[m][c] = true;
        const double cost = c_.forward_by_rank.empty() ? c_.forward : c_.forward_by_rank.at(r);
        st.timeline.push_back({a, st.time, st.time + cost});
        st.time += cost;
        st.busy += cost;
        st.peak = std::max(st.peak, ++st.in_flight);
        return true;
      }
      case Op::Backward:
      case Op::BackwardInput: {
        if (!st.forwarded[m][c]) fail(where(r, st.pc) + ": backward before its own forward");
        if (st.bwd[m][c] != BwdState::None) fail(where(r, st.pc) + ": microbatch backwarded twice");
        if (vs < S - 1 && !st.grad_received[m][c])
          fail(where(r, st.pc) + ": backward on virtual stage " + std::to_string(vs) +
               " before its gradient was received from virtual stage " + std::to_string(vs + 1));
        const bool full = a.op == Op::Backward;
        st.bwd[m][c] = full ? BwdState::Full : BwdState::Input;
        const double cost = full ? (c_.backward_by_rank.empty() ? c_.backward : c_.backward_by_rank.at(r))
                                 : (c_.backward_input_by_rank.empty() ? c_.backward_input : c_.backward_input_by_rank.at(r));
        st.timeline.push_back({a, st.time, st.time + cost});
        st.time += cost;
        st.busy += cost;
        --st.in_flight;
        return true;
      }
      case Op::BackwardWeight: {
        if (st.bwd[m][c] == BwdState::None) fail(where(r, st.pc) + ": weight backward before its input backward");
        if (st.bwd[m][c] == BwdState::Full)
          fail(where(r, st.pc) + ": weight backward after a full backward of the same microbatch/chunk");
        if (st.bwd[m][c] == BwdState::InputWeight) fail(where(r, st.pc) + ": weight backward done twice");
        st.bwd[m][c] = BwdState::InputWeight;
        const double cost = c_.backward_weight_by_rank.empty() ? c_.backward_weight : c_.backward_weight_by_rank.at(r);
        st.timeline.push_back({a, st.time, st.time + cost});
        st.time += cost;
        st.busy += cost;
        return true;
      }
      case Op::SendActivation: {
        if (vs == S - 1) fail(where(r, st.pc) + ": the last virtual stage sends no activation");
        if (a.peer != s_.rank_of(vs + 1))
          fail(where(r, st.pc) + ": virtual stage " + std::to_string(vs + 1) + " is on rank " +
               std::to_string(s_.rank_of(vs + 1)) + ", not " + std::to_string(a.peer));
        if (!st.forwarded[m][c]) fail(where(r, st.pc) + ": activation sent before the forward computed it");
        st.time += c_.send;
        channels_[{r, a.peer, kAct}].push_back(Message{m, vs, st.time + c_.comm});
        return true;
      }
      case Op::SendGrad: {
        if (vs == 0) fail(where(r, st.pc) + ": the first virtual stage sends no gradient");
        if (a.peer != s_.rank_of(vs - 1))
          fail(where(r, st.pc) + ": virtual stage " + std::to_string(vs - 1) + " is on rank " +
               std::to_string(s_.rank_of(vs - 1)) + ", not " + std::to_string(a.peer));
        if (st.bwd[m][c] == BwdState::None)
          fail(where(r, st.pc) + ": gradient sent before the backward computed it");
        st.time += c_.send;
        channels_[{r, a.peer, kGrad}].push_back(Message{m, vs, st.time + c_.comm});
        return true;
      }
      case Op::RecvActivation:
      case Op::RecvGrad: {
        const bool act = a.op == Op::RecvActivation;
        const int src_vs = act ? vs - 1 : vs + 1;
        if (src_vs < 0 || src_vs >= S)
          fail(where(r, st.pc) + ": virtual stage " + std::to_string(vs) + " receives no " +
               (act ? "activation" : "gradient"));
        if (a.peer != s_.rank_of(src_vs))
          fail(where(r, st.pc) + ": virtual stage " + std::to_string(src_vs) + " is on rank " +
               std::to_string(s_.rank_of(src_vs)) + ", not " + std::to_string(a.peer));
        auto& q = channels_[{a.peer, r, act ? kAct : kGrad}];
        if (q.empty()) return false;  // blocked
        const Message msg = q.front();
        if (msg.microbatch != m || msg.src_virtual_stage != src_vs) {
          std::ostringstream os;
          os << where(r, st.pc) << ": out-of-order message on channel rank " << a.peer << " -> rank " << r << " ("
             << (act ? "activations" : "gradients") << "): expected microbatch " << m << " from virtual stage "
             << src_vs << ", the oldest unreceived one is microbatch " << msg.microbatch << " from virtual stage "
             << msg.src_virtual_stage;
          fail(os.str());
        }
        q.pop_front();
        st.time = std::max(st.time, msg.available) + c_.recv;
        (act ? st.act_received : st.grad_received)[m][c] = true;
        return true;
      }
    }
    return true;
  }

  void loop() {
    const int p = s_.stages;
    for (;;) {
      bool any = false;
      for (int r = 0; r < p; ++r) any = advance(r) || any;
      bool done = true;
      for (int r = 0; r < p; ++r) done = done && ranks_[r].pc == s_.actions[r].size();
      if (done) return;
      if (!any) {
        std::ostringstream os;
        os << "deadlock:";
        for (int r = 0; r < p; ++r) {
          if (ranks_[r].pc == s_.actions[r].size()) {
            os << " rank " << r << " finished;";
          } else {
            os << " rank " << r << " waits at " << where(r, ranks_[r].pc) << ";";
          }
        }
        fail(os.str());
      }
    }
  }

  void check_complete() {
    for (const auto& [key, q] : channels_) {
      if (q.empty()) continue;
      const auto& [src, dst, kind] = key;
      std::ostringstream os;
      os << q.size() << " " << (kind == kAct ? "activation" : "gradient") << " message(s) from rank " << src
         << " to rank " << dst << " never received (first: microbatch " << q.front().microbatch
         << " from virtual stage " << q.front().src_virtual_stage << ")";
      fail(os.str());
    }
    for (int r = 0; r < s_.stages; ++r) {
      for (int m = 0; m < s_.microbatches; ++m) {
        for (int c = 0; c < s_.chunks; ++c) {
          const RankState& st = ranks_[r];
          std::string what = "rank " + std::to_string(r) + " microbatch " + std::to_string(m) + " chunk " +
                             std::to_string(c);
          if (!st.forwarded[m][c]) fail(what + " is never forwarded");
          if (st.bwd[m][c] == BwdState::None) fail(what + " is never backwarded");
          if (st.bwd[m][c] == BwdState::Input) fail(what + " has an input backward but no weight backward");
        }
      }
    }
  }

  void fill_stats(SimResult& res) const {
    const int p = static_cast<int>(ranks_.size());
    double makespan = 0, ideal = 0;
    for (const auto& st : ranks_) {
      makespan = std::max(makespan, st.time);
      ideal = std::max(ideal, st.busy);
      res.busy.push_back(st.busy);
      res.timeline.push_back(st.timeline);
      res.finish.push_back(st.time);
      res.peak_in_flight.push_back(st.peak);
    }
    res.makespan = makespan;
    if (makespan > 0 && p > 0) {
      double idle = 0;
      for (const auto& st : ranks_) idle += (makespan - st.busy) / makespan;
      res.bubble_fraction = idle / p;
    }
    res.bubble_ratio = ideal > 0 ? (makespan - ideal) / ideal : 0;
  }

  const Schedule& s_;
  const SimCosts& c_;
  std::vector<RankState> ranks_;
  // FIFO channels keyed (src rank, dst rank, kind).
  std::map<std::tuple<int, int, int>, std::deque<Message>> channels_;
};

}  // namespace

SimResult simulate(const Schedule& schedule, const SimCosts& costs) { return Simulator(schedule, costs).run(); }

std::string chrome_trace(const Schedule& schedule, const SimResult& result, double us_per_unit) {
  nlohmann::json events = nlohmann::json::array();
  for (size_t r = 0; r < result.timeline.size(); ++r) {
    const int pid = static_cast<int>(r);
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid},
                      {"args", {{"name", "rank " + std::to_string(r) + " (simulated " + schedule.name + ")"}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    for (const SimSlice& slice : result.timeline[r])
      events.push_back({{"ph", "X"}, {"cat", "compute"}, {"name", to_string(slice.action)}, {"pid", pid}, {"tid", 0},
                        {"ts", slice.start * us_per_unit}, {"dur", (slice.end - slice.start) * us_per_unit},
                        {"args", {{"microbatch", slice.action.microbatch}, {"chunk", slice.action.chunk}}}});
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

SimCosts zero_bubble_costs(int stages, double forward, double backward_input, double backward_weight) {
  SimCosts c;
  c.forward = forward;
  c.backward = backward_input + backward_weight;
  c.backward_input_by_rank.assign(std::max(stages, 1), backward_input);
  c.backward_weight_by_rank.assign(std::max(stages, 1), backward_weight);
  c.backward_input_by_rank[0] = 0;
  c.backward_weight_by_rank[0] = backward_input + backward_weight;
  return c;
}

}  // namespace smp
