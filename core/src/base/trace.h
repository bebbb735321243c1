// Timeline traces (run.trace): each rank records what it does during the traced
// steps (run.trace_steps = [from, to], 1-based, inclusive) as Chrome trace /
// Perfetto events and writes <run.dir>/trace/rank-<r>.json at the end; with
// run.trace_merge rank 0 also writes <run.dir>/trace.json, one process track
// per rank. Open either in ui.perfetto.dev or chrome://tracing.
//
// One recorder per process (a rank is a process). Recording is off unless the
// job enables it and a traced step is running, and then costs a clock read and
// a push per event; nothing is written before the end of the run.
//
// Tracks: tid 0 "main" (step, phases, schedule actions, waits), tid 1 "comm"
// (collectives in flight, as async slices from issue to completion).
#pragma once

#include <smp/tracing.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace smp::trace {

struct Arg {
  std::string key;
  std::string text;  // used when !numeric
  double number = 0;
  bool numeric = true;
  Arg(std::string k, double v) : key(std::move(k)), number(v) {}
  Arg(std::string k, std::string v) : key(std::move(k)), text(std::move(v)), numeric(false) {}
};
using Args = std::vector<Arg>;

// The training step (0-based) starting now, or -1 between steps (validation, setup).
void set_step(int64_t step);
bool active();
int64_t now_us();  // microseconds on a clock shared by the ranks of a host (steady clock)

// A finished slice on the main track.
void complete(const char* category, const std::string& name, int64_t start_us, int64_t end_us, Args args = {});
// A collective's life (issue to completion) on the comm track.
void async_slice(const char* category, const std::string& name, int64_t start_us, int64_t end_us, Args args = {});

// Records the enclosing scope as a slice when recording is active at its start.
class Scope {
 public:
  Scope(const char* category, std::string name, Args args = {});
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  void add(Arg a) { args_.push_back(std::move(a)); }

 private:
  const char* category_;
  std::string name_;
  Args args_;
  int64_t start_ = -1;
};

// This process's events as a Chrome trace document (JSON text), and writing it.
std::string chrome_json();
// configure, write_rank_file, merge_rank_files: <smp/tracing.h>.

}  // namespace smp::trace
