#include "base/op_profile.h"

#include <smp/error.h>

#include <nlohmann/json.hpp>
#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <boost/filesystem.hpp>
#include <fstream>
#include <map>
#include <vector>

namespace smp::op_profile {

namespace {

struct OpTotals {
  int64_t calls = 0;
  double self_us = 0, total_us = 0;
};

struct State {
  bool enabled = false;
  int64_t first = 0, last = -1;
  int64_t steps = 0;
  std::map<std::string, OpTotals> ops;
};

State& state() {
  static State s;
  return s;
}

// The ops of the thread between a StepScope's start and end, through a
// thread-local RecordFunction callback: each op's start time on a stack, so
// that an op's self time is its total minus its children's.
struct Started : at::ObserverContext {
  explicit Started(double t) : start_us(t) {}
  double start_us;
};

thread_local std::vector<double> children_us;  // per open op: its children's total so far

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) {
  children_us.push_back(0.0);
  return std::make_unique<Started>(now_us());
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (!ctx || children_us.empty()) return;
  const double total = now_us() - static_cast<Started*>(ctx)->start_us;
  const double children = children_us.back();
  children_us.pop_back();
  OpTotals& t = state().ops[fn.name()];
  ++t.calls;
  t.total_us += total;
  t.self_us += total - children;
  if (!children_us.empty()) children_us.back() += total;
}

}  // namespace

void configure(bool enabled, int64_t first_step, int64_t last_step) {
  State& s = state();
  s = State();
  s.enabled = enabled, s.first = first_step, s.last = last_step;
}

StepScope::StepScope(int64_t step) {
  const State& s = state();
  if (!s.enabled || step < s.first || step > s.last) return;
  handle_ = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end)
                                            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  recording_ = true;
}

StepScope::~StepScope() {
  if (!recording_) return;
  at::removeCallback(handle_);
  children_us.clear();
  ++state().steps;
}

std::string write_rank_file(const std::string& run_dir, int rank) {
  const State& s = state();
  std::vector<std::pair<std::string, OpTotals>> ops(s.ops.begin(), s.ops.end());
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.self_us > b.second.self_us; });
  const double n = std::max<int64_t>(1, s.steps);
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [name, t] : ops)
    list.push_back({{"name", name}, {"calls", t.calls / n}, {"self_us", t.self_us / n}, {"total_us", t.total_us / n}});
  const std::string dir = run_dir + "/ops";
  boost::system::error_code ec;  // Boost, not std::filesystem (base/logging.cpp says why)
  boost::filesystem::create_directories(dir, ec);
  if (ec) throw Error("run.profile_ops: cannot create " + dir + ": " + ec.message());
  const std::string path = dir + "/rank-" + std::to_string(rank) + ".json";
  std::ofstream out(path);
  out << nlohmann::json{{"steps", s.steps}, {"per", "step"}, {"ops", list}}.dump(1) << "\n";
  if (!out) throw Error("run.profile_ops: cannot write " + path);
  return path;
}

}  // namespace smp::op_profile
