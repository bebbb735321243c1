// Launching smp jobs (smp-launch subprocesses) and the plain-LibTorch subprocess,
// machine facts (load, cores), the fp32 GEMM peak, and small table/JSON helpers.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace bench {

using nlohmann::json;

inline constexpr const char* kTunedMalloc =
    "MALLOC_TRIM_THRESHOLD_=17179869184 MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TOP_PAD_=268435456";

struct Paths {
  std::string bin_dir;     // where smp-bench, smp-launch and smp-worker live
  std::string self;        // this executable
  std::string source_dir;  // the smp source tree (for bench/configs)
  std::string work_dir;    // run dirs go under here
  bool keep_runs = false;  // keep the run folders (else removed after reading)
  // glibc malloc settings exported to every job (plain and smp alike) so that freed
  // activations stay in the heap instead of going back to the kernel and page-faulting
  // in again every step; empty = leave the environment alone. See bench/README.md, "Allocator".
  std::string malloc_env = kTunedMalloc;
};
Paths& paths();

struct Job {
  std::string label;
  bool plain = false;  // the plain LibTorch loop (smp-bench <plain_command>) instead of smp
  int nproc = 1;
  std::string config;
  std::vector<std::string> overrides;
  std::string plugin = "gpt";               // the smp job's adapter plugin
  std::string plain_command = "plain-run";  // the plain loop's subcommand (plain-ncf for NCF)
  // With plain: a Python script run by /usr/bin/python3 instead (the PyTorch-eager
  // peer, bench/eager_gpt.py, same arguments and summary), given python_args too.
  std::string python_script;
  std::vector<std::string> python_args;
  // Profile steps 3..N op by op (smp: run.profile_ops; the eager script:
  // --profile-ops); the result lands in JobResult::op_profile.
  bool profile_ops = false;
  // smp only: start this many independent copies of the job at once (each its own
  // smp-launch, run folder and port; they share nothing). The result's summary is
  // the slowest copy's, with every copy's step_seconds in "copies_step_seconds".
  // Two one-rank copies are the no-communication bound of dp = 2 weak scaling.
  int copies = 1;
};

struct JobResult {
  int exit_code = -1;
  double wall_s = 0;
  std::string output;  // launcher + rank 0 output (tail kept on failure)
  json summary;        // <run.dir>/summary.json, null when missing
  // CPU use by OTHER processes while the job ran, in cores: (all busy CPU time from
  // /proc/stat - the job's own CPU time from getrusage(RUSAGE_CHILDREN)) / wall time.
  double competing_cores = 0;
  std::vector<double> step_seconds_each;  // every step, from the rank-0 log (ms resolution) or the plain summary
  double job_cpu_cores = 0;  // the job's own CPU time / wall time
  // run.trace = true: the ranks' traces (<run.dir>/trace/rank-<r>.json), read
  // before the run folder goes; empty otherwise.
  std::vector<json> traces;
  json op_profile;  // profile_ops: rank 0's <run.dir>/ops/rank-0.json, null otherwise
};

// smp: smp-launch --nproc-per-node N --threads-per-rank 1 --master-port <free> --plugin gpt
//        --config C --set run.dir=<fresh> --set run.threads=1 --set ...
// plain: OMP_NUM_THREADS=1 smp-bench plain-run --config C --set ... --out <fresh>/summary.json
JobResult run_job(const Job& job);

// A shell command's exit code, output (stdout and stderr together) and wall time.
struct CommandResult {
  int code = -1;
  std::string output;
  double seconds = 0;
};
CommandResult run_command(const std::string& command);

// Busy CPU seconds of the whole machine so far (/proc/stat), and our children's CPU seconds.
double machine_busy_seconds();
double children_cpu_seconds();
// Cores kept busy by other processes over `seconds` while this process idles.
double competing_cores_now(double seconds = 1.0);

// Cores other processes kept busy on average since construction: the
// machine's busy time less this process's and its waited-for children's CPU
// time, over the wall time. For a benchmark that measures in-process work as
// well as jobs (run_job counts its job's children alone).
class OtherCores {
 public:
  OtherCores();
  double cores() const;

 private:
  double busy0_, own0_;
  std::chrono::steady_clock::time_point t0_;
};

// Waits (up to max_wait_s) while other processes keep more than quiet_cores
// busy, sampling sample_s first and twice that after; returns the cores they
// kept busy last.
double wait_for_quiet_cores(double quiet_cores, double max_wait_s, double sample_s = 1.0);

// 1-, 5-, 15-minute load averages.
std::vector<double> load_average();
int online_cores();
// Waits (up to max_wait_s) until the 1-minute load is below `threshold`;
// returns the load seen last. Prints what it waits for.
double wait_for_quiet(double threshold, double max_wait_s);
json machine_json();  // host, cpu, cores, load, time and the source commit
// The source tree's commit (bench/source_commit.sh: "-dirty" when tracked
// files other than the results had changes), so a result says which code it measured.
std::string source_commit();

// Best-of-5 timed fp32 GEMM (n x n, n = 512 and 1024) on ONE intra-op thread: FLOP/s.
double gemm_peak_flops_1thread();

// Run `jobs` `repeat` times, interleaved (all jobs once, then again...); per job the
// run with the lowest step_seconds is kept; all step times are recorded.
struct Measured {
  Job job;
  JobResult best;
  std::vector<double> step_seconds_all;
  std::vector<double> competing_cores_all;  // per attempt
  std::vector<double> median_step_all;      // per successful attempt: median step time over steps 2..N
  std::vector<json> summary_all;            // per successful attempt: its summary
  bool ok = false;
};
// Before each job: sample other processes' CPU use for 1 s and wait (up to job_wait_s)
// while it is above quiet_cores. A job during which other processes kept more
// than quiet_cores busy on average is not a valid measurement: it runs again
// (at most kInvalidRetries times), and the attempt is kept in
// invalid_attempts() (the JSON's "invalid_attempts", written by every
// benchmark's result) instead of its measurements.
inline constexpr int kInvalidRetries = 3;
std::vector<Measured> run_repeated(const std::vector<Job>& jobs, int repeat, double quiet_cores = 0.5,
                                   double job_wait_s = 60);

// The attempts run_repeated set aside, each {label, round, competing_cores,
// step_seconds, kept}: kept when the retries ran out and it stands in the
// measurements anyway (then it is named there too).
json& invalid_attempts();

// Whether an in-process measurement during which other processes kept `busy`
// cores busy stands, by run_repeated's rule: no when busy > quiet_cores,
// unless this was the last allowed attempt; a set-aside or kept-busy attempt
// goes into invalid_attempts() and is reported on stderr.
bool attempt_stands(const std::string& label, int round, int attempt, double busy, double quiet_cores);

// fn() measured under that rule: waits for a quiet machine before each
// attempt and returns the value of the attempt that stands. round counts from 1.
template <class F>
auto measure_valid(const std::string& label, int round, double quiet_cores, double wait_s, F&& fn) {
  for (int attempt = 0;; ++attempt) {
    wait_for_quiet_cores(quiet_cores, wait_s);
    const OtherCores others;
    auto value = fn();
    if (attempt_stands(label, round, attempt, others.cores(), quiet_cores)) return value;
  }
}

// A result's "validity": the rule, quiet_cores and invalid_attempts().
json validity_json(double quiet_cores);

// The overrides `base` followed by `extra` (a job's own settings after every job's).
inline std::vector<std::string> with_extra(std::vector<std::string> base, const std::vector<std::string>& extra) {
  base.insert(base.end(), extra.begin(), extra.end());
  return base;
}

// Median of v[skip..] (NaN when empty).
double median_from(const std::vector<double>& v, size_t skip);

// Table printing.
std::string fmt(double v, int prec = 3);
std::string human_bytes(double b);
void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

void write_json(const std::string& path, const json& j);
std::string default_config();
std::string now_iso();

}  // namespace bench
