#include "base/trace.h"

#include <smp/error.h>

#include <nlohmann/json.hpp>

#include <boost/filesystem.hpp>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>

namespace smp::trace {

namespace {

struct Event {
  char phase;  // 'X' complete, 'b' / 'e' async begin / end
  const char* category;
  std::string name;
  int64_t ts, dur;
  int tid;
  uint64_t id;
  Args args;
};

struct Recorder {
  std::mutex mu;  // the events and labels; the window below is read without it
  // What active() reads: any thread asks (communicator callbacks, the
  // checkpoint writer) while the training thread moves the step on.
  std::atomic<bool> enabled{false};
  std::atomic<int64_t> first{0}, last{-1};  // 0-based steps, inclusive
  std::atomic<int64_t> step{-1};
  int rank = 0;
  std::string label;
  uint64_t next_id = 1;
  std::vector<Event> events;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

nlohmann::json args_json(const Args& args) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& a : args) {
    if (a.numeric) j[a.key] = a.number;
    else j[a.key] = a.text;
  }
  return j;
}

}  // namespace

void configure(bool enabled, int rank, const std::string& label, int64_t first_step, int64_t last_step) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.enabled = enabled;
  r.rank = rank;
  r.label = label;
  r.first = first_step;
  r.last = last_step;
  r.events.clear();
}

void set_step(int64_t step) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.step = step;
}

bool active() {
  Recorder& r = recorder();
  if (!r.enabled.load(std::memory_order_acquire)) return false;
  const int64_t step = r.step.load(std::memory_order_acquire);
  return step >= r.first.load(std::memory_order_acquire) && step <= r.last.load(std::memory_order_acquire);
}

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void complete(const char* category, const std::string& name, int64_t start_us, int64_t end_us, Args args) {
  if (!active()) return;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  r.events.push_back({'X', category, name, start_us, end_us - start_us, 0, 0, std::move(args)});
}

void async_slice(const char* category, const std::string& name, int64_t start_us, int64_t end_us, Args args) {
  if (!active()) return;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  const uint64_t id = r.next_id++;
  r.events.push_back({'b', category, name, start_us, 0, 1, id, std::move(args)});
  r.events.push_back({'e', category, name, end_us, 0, 1, id, {}});
}

Scope::Scope(const char* category, std::string name, Args args)
    : category_(category), name_(std::move(name)), args_(std::move(args)) {
  if (active()) start_ = now_us();
}
Scope::~Scope() {
  if (start_ >= 0) complete(category_, name_, start_, now_us(), std::move(args_));
}

std::string chrome_json() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r.rank}, {"args", {{"name", r.label}}}});
  events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", r.rank}, {"args", {{"sort_index", r.rank}}}});
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r.rank}, {"tid", 0}, {"args", {{"name", "main"}}}});
  events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r.rank}, {"tid", 1}, {"args", {{"name", "comm"}}}});
  for (const auto& e : r.events) {
    nlohmann::json j{{"ph", std::string(1, e.phase)}, {"cat", e.category}, {"name", e.name},
                     {"ts", e.ts},                    {"pid", r.rank},    {"tid", e.tid}};
    if (e.phase == 'X') j["dur"] = e.dur;
    if (e.phase != 'X') j["id"] = e.id;
    if (!e.args.empty()) j["args"] = args_json(e.args);
    events.push_back(std::move(j));
  }
  return nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

std::string write_rank_file(const std::string& run_dir) {
  if (!recorder().enabled) return "";
  namespace fs = boost::filesystem;
  const fs::path dir = fs::path(run_dir) / "trace";
  fs::create_directories(dir);
  const std::string path = (dir / ("rank-" + std::to_string(recorder().rank) + ".json")).string();
  std::ofstream out(path);
  out << chrome_json();
  if (!out) throw Error("run.trace: writing " + path + " failed");
  return path;
}

std::string merge_rank_files(const std::string& run_dir, int ranks) {
  namespace fs = boost::filesystem;
  nlohmann::json all = nlohmann::json::array();
  for (int r = 0; r < ranks; ++r) {
    const std::string path = (fs::path(run_dir) / "trace" / ("rank-" + std::to_string(r) + ".json")).string();
    std::ifstream in(path);
    if (!in) throw Error("run.trace_merge: rank " + std::to_string(r) + "'s trace " + path + " is missing");
    nlohmann::json j = nlohmann::json::parse(in);
    for (auto& e : j["traceEvents"]) all.push_back(std::move(e));
  }
  const std::string out_path = (fs::path(run_dir) / "trace.json").string();
  std::ofstream out(out_path);
  out << nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump();
  if (!out) throw Error("run.trace_merge: writing " + out_path + " failed");
  return out_path;
}

}  // namespace smp::trace
