#include "jobs.h"

#include <smp/process_env.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <cctype>
#include <array>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <regex>
#include <sstream>
#include <thread>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace bench {

namespace fs = boost::filesystem;

Paths& paths() {
  static Paths p;
  return p;
}

namespace {

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string fresh_dir(const std::string& label) {
  fs::path base = paths().work_dir.empty() ? fs::temp_directory_path() / "smp-bench" : fs::path(paths().work_dir);
  fs::create_directories(base);
  std::string safe;
  for (char c : label) safe += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  return (base / fs::unique_path(safe + "-%%%%%%")).string();
}

std::string tail(const std::string& s, size_t n) { return s.size() <= n ? s : "..." + s.substr(s.size() - n); }

}  // namespace

double machine_busy_seconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  long long user = 0, nice = 0, sys = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> sys >> idle >> iowait >> irq >> softirq >> steal;
  return static_cast<double>(user + nice + sys + irq + softirq + steal) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double children_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

namespace {
double own_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return children_cpu_seconds() + static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}
}  // namespace

OtherCores::OtherCores()
    : busy0_(machine_busy_seconds()), own0_(own_cpu_seconds()), t0_(std::chrono::steady_clock::now()) {}

double OtherCores::cores() const {
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  if (wall <= 0) return 0.0;
  return std::max(0.0, (machine_busy_seconds() - busy0_ - (own_cpu_seconds() - own0_)) / wall);
}

double competing_cores_now(double seconds) {
  const double b0 = machine_busy_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return (machine_busy_seconds() - b0) / wall;
}

namespace {

// The shell command for one smp job writing into run_dir.
std::string smp_command(const Job& job, const std::string& run_dir) {
  std::string cmd = quote(paths().bin_dir + "/smp-launch") + " --nproc-per-node " + std::to_string(job.nproc) +
                    " --threads-per-rank 1 --master-port " + std::to_string(smp::find_free_port()) + " --plugin " +
                    job.plugin + " --config " + quote(job.config) + " --set " + quote("run.dir=" + run_dir) +
                    " --set run.threads=1";
  for (const auto& o : job.overrides) cmd += " --set " + quote(o);
  if (job.profile_ops) cmd += " --set run.profile_ops=true --set " + quote("run.trace_steps=[3, 1000000]");
  return cmd;
}

}  // namespace

JobResult run_job(const Job& job) {
  JobResult r;
  const std::string run_dir = fresh_dir(job.label);
  if (job.copies > 1 && (job.plain || job.profile_ops))
    throw std::invalid_argument("bench job '" + job.label + "': copies > 1 is for plain smp jobs only");
  std::string cmd;
  if (!paths().malloc_env.empty()) cmd = paths().malloc_env + " ";
  if (job.plain) {
    fs::create_directories(run_dir);
    cmd += "OMP_NUM_THREADS=1 " +
           (job.python_script.empty() ? quote(paths().self) + " " + job.plain_command
                                      : std::string("/usr/bin/python3 ") + quote(job.python_script)) +
           " --config " + quote(job.config);
    for (const auto& o : job.overrides) cmd += " --set " + quote(o);
    for (const auto& a : job.python_args) cmd += " " + quote(a);
    cmd += " --out " + quote(run_dir + "/summary.json");
    if (job.profile_ops) {
      fs::create_directories(run_dir + "/ops");
      cmd += " --profile-ops " + quote(run_dir + "/ops/rank-0.json");
    }
  } else if (job.copies > 1) {
    // Started together, waited for together; the exit status is the first failing copy's.
    std::string env = cmd;
    cmd = "status=0; pids=; ";
    for (int k = 0; k < job.copies; ++k)
      cmd += env + smp_command(job, run_dir + "/copy-" + std::to_string(k)) + " 2>&1 & pids=\"$pids $!\"; ";
    cmd += "for p in $pids; do wait $p || { [ $status = 0 ] && status=$?; }; done; exit $status";
    cmd = "sh -c " + quote(cmd);
  } else {
    cmd += smp_command(job, run_dir);
  }
  cmd += " 2>&1";
  const double busy0 = machine_busy_seconds(), kids0 = children_cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = popen(cmd.c_str(), "r");
  std::array<char, 4096> buf{};
  while (pipe && fgets(buf.data(), buf.size(), pipe)) r.output += buf.data();
  int status = pipe ? pclose(pipe) : -1;
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double kids = children_cpu_seconds() - kids0;
  r.job_cpu_cores = kids / r.wall_s;
  r.competing_cores = std::max(0.0, (machine_busy_seconds() - busy0 - kids) / r.wall_s);
  r.exit_code = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto read_summary = [&](const std::string& dir) {
    json j;
    std::ifstream in(dir + "/summary.json");
    if (!in) return j;
    try {
      j = json::parse(in);
    } catch (const std::exception& e) {
      r.output += "\nsmp-bench: cannot parse " + dir + "/summary.json: " + e.what();
    }
    return j;
  };
  if (job.copies > 1) {
    // The slowest copy stands for the job: a step of k copies is done when the last is.
    json steps = json::array();
    for (int k = 0; k < job.copies; ++k) {
      json s = read_summary(run_dir + "/copy-" + std::to_string(k));
      if (!s.is_object() || !s.contains("step_seconds")) {
        r.summary = nullptr;
        break;
      }
      steps.push_back(s["step_seconds"]);
      if (r.summary.is_null() || s["step_seconds"].get<double>() > r.summary["step_seconds"].get<double>())
        r.summary = s;
    }
    if (!r.summary.is_null()) {
      r.summary["copies_step_seconds"] = steps;
      // Had the copies run in lockstep (as the ranks of a synchronous job do),
      // each step would have lasted as long as the slowest copy's: the mean over
      // steps 2..N of the per-step maximum (steps k of the copies, started
      // together and of about equal length, overlap in time).
      std::vector<std::vector<double>> each;
      for (int k = 0; k < job.copies; ++k)
        each.push_back(read_summary(run_dir + "/copy-" + std::to_string(k)).value("step_seconds_each", std::vector<double>{}));
      size_t n = each[0].size();
      for (const auto& e : each) n = std::min(n, e.size());
      if (n > 1) {
        double sum = 0;
        for (size_t i = 1; i < n; ++i) {
          double worst = 0;
          for (const auto& e : each) worst = std::max(worst, e[i]);
          sum += worst;
        }
        r.summary["lockstep_step_seconds"] = sum / static_cast<double>(n - 1);
      }
    }
  } else {
    r.summary = read_summary(run_dir);
  }
  for (int rank = 0; rank < job.nproc; ++rank) {
    std::ifstream t(run_dir + "/trace/rank-" + std::to_string(rank) + ".json");
    if (!t) break;
    r.traces.push_back(json::parse(t));
  }
  if (job.profile_ops) {
    std::ifstream ops(run_dir + "/ops/rank-0.json");
    if (ops) r.op_profile = json::parse(ops);
  }
  if (job.plain && r.summary.contains("step_seconds_each")) {
    r.step_seconds_each = r.summary["step_seconds_each"].get<std::vector<double>>();
  } else if (job.copies == 1) {  // (the copies' log lines interleave: no per-step times)
    // rank 0's progress lines: "step 3/12 | loss ... | 297 ms | eta ..."
    static const std::regex line(R"(step (\d+)/(\d+) \|[^\n]*?\| (\d+) ms \|)");
    for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line); it != std::sregex_iterator(); ++it)
      r.step_seconds_each.push_back(std::stod((*it)[3].str()) / 1000.0);
  }
  if (r.exit_code != 0 || r.summary.is_null())
    std::cerr << "smp-bench: job '" << job.label << "' failed (exit " << r.exit_code << ")\n$ " << cmd << "\n"
              << tail(r.output, 4000) << "\n";
  r.output = "$ " + cmd + "\n" + tail(r.output, 2000);
  if (!paths().keep_runs) {
    boost::system::error_code ec;
    fs::remove_all(run_dir, ec);
  }
  return r;
}

std::vector<double> load_average() {
  double l[3] = {0, 0, 0};
  if (getloadavg(l, 3) != 3) return {-1, -1, -1};
  return {l[0], l[1], l[2]};
}

int online_cores() { return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)); }

double wait_for_quiet(double threshold, double max_wait_s) {
  const auto t0 = std::chrono::steady_clock::now();
  double l = load_average()[0];
  bool told = false;
  while (l >= threshold &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < max_wait_s) {
    if (!told) {
      std::cerr << "smp-bench: 1-min load " << fmt(l, 2) << " >= " << fmt(threshold, 2) << ", waiting up to "
                << max_wait_s << " s for a quieter machine...\n";
      told = true;
    }
    std::this_thread::sleep_for(std::chrono::seconds(5));
    l = load_average()[0];
  }
  if (l >= threshold) std::cerr << "smp-bench: still busy (load " << fmt(l, 2) << "); measuring anyway\n";
  return l;
}

json machine_json() {
  auto l = load_average();
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string cpu;
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  return {{"host", host}, {"cpu", cpu},       {"cores", online_cores()}, {"load_1_5_15", l},
          {"time", now_iso()}, {"commit", source_commit()}};
}

std::string source_commit() {
  const std::string cmd = "bash '" + paths().source_dir + "/bench/source_commit.sh' 2>/dev/null";
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[128];
    while (fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown (not a git checkout)" : out;
}

double gemm_peak_flops_1thread() {
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  double best = 0;
  for (int64_t n : {512, 1024}) {
    at::Tensor a = at::randn({n, n}), b = at::randn({n, n});
    at::Tensor c = at::mm(a, b);  // warm-up
    const int reps = n == 512 ? 8 : 2;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) at::mm_out(c, a, b);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, reps * 2.0 * n * n * n / s);
    }
  }
  at::set_num_threads(before);
  return best;
}

CommandResult run_command(const std::string& command) {
  const auto t0 = std::chrono::steady_clock::now();
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run: " + command);
  CommandResult r;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) r.output.append(buffer, n);
  const int status = ::pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return r;
}

double wait_for_quiet_cores(double quiet_cores, double max_wait_s, double sample_s) {
  const auto w0 = std::chrono::steady_clock::now();
  double busy = competing_cores_now(sample_s);
  while (busy > quiet_cores && std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count() < max_wait_s)
    busy = competing_cores_now(2 * sample_s);
  return busy;
}

std::vector<Measured> run_repeated(const std::vector<Job>& jobs, int repeat, double quiet_cores, double job_wait_s) {
  std::vector<Measured> out(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) out[i].job = jobs[i];
  for (int r = 0; r < std::max(1, repeat); ++r)
    for (size_t i = 0; i < jobs.size(); ++i) {
      const double busy = wait_for_quiet_cores(quiet_cores, job_wait_s);
      std::cerr << "smp-bench: [" << (r + 1) << "/" << repeat << "] " << jobs[i].label << " (load "
                << fmt(load_average()[0], 2) << ", others busy " << fmt(busy, 2) << " cores before)" << std::flush;
      JobResult res = run_job(jobs[i]);
      for (int retry = 0; res.competing_cores > quiet_cores; ++retry) {
        const bool kept = retry == kInvalidRetries;
        invalid_attempts().push_back(
            {{"label", jobs[i].label},
             {"round", r + 1},
             {"competing_cores", res.competing_cores},
             {"step_seconds", res.summary.is_object() ? res.summary.value("step_seconds", json()) : json()},
             {"kept", kept}});
        std::cerr << " -> other processes used " << fmt(res.competing_cores, 2) << " cores meanwhile: "
                  << (kept ? "kept, marked invalid" : "not valid, again") << "\n";
        if (kept) break;
        wait_for_quiet_cores(quiet_cores, job_wait_s);
        res = run_job(jobs[i]);
      }
      const bool ok = res.exit_code == 0 && res.summary.is_object() && res.summary.contains("step_seconds");
      double s = ok ? res.summary["step_seconds"].get<double>() : std::numeric_limits<double>::quiet_NaN();
      std::cerr << " -> " << (ok ? fmt(1000 * s, 1) + " ms/step" : std::string("FAILED")) << " (" << fmt(res.wall_s, 1)
                << " s wall, other processes used " << fmt(res.competing_cores, 2) << " cores meanwhile)\n";
      out[i].competing_cores_all.push_back(res.competing_cores);
      if (!ok) {
        if (!out[i].ok) out[i].best = res;
        continue;
      }
      out[i].step_seconds_all.push_back(s);
      out[i].median_step_all.push_back(median_from(res.step_seconds_each, 1));
      out[i].summary_all.push_back(res.summary);
      if (!out[i].ok || s < out[i].best.summary["step_seconds"].get<double>()) out[i].best = res;
      out[i].ok = true;
    }
  return out;
}

json& invalid_attempts() {
  static json attempts = json::array();
  return attempts;
}

bool attempt_stands(const std::string& label, int round, int attempt, double busy, double quiet_cores) {
  if (busy <= quiet_cores) return true;
  const bool kept = attempt >= kInvalidRetries;
  invalid_attempts().push_back({{"label", label}, {"round", round}, {"competing_cores", busy}, {"kept", kept}});
  std::cerr << label << " round " << round << ": other processes used " << fmt(busy, 2) << " cores meanwhile: "
            << (kept ? "kept, marked invalid" : "not valid, again") << std::endl;
  return kept;
}

json validity_json(double quiet_cores) {
  return {{"rule", "a run during which other processes kept more than quiet_cores busy on average is run again, up "
                   "to " + std::to_string(kInvalidRetries) +
                   " times; every such attempt is listed, kept = true where it stands in the measurements"},
          {"quiet_cores", quiet_cores},
          {"invalid_attempts", invalid_attempts()}};
}

double median_from(const std::vector<double>& v, size_t skip) {
  if (v.size() <= skip) return std::numeric_limits<double>::quiet_NaN();
  std::vector<double> w(v.begin() + static_cast<long>(skip), v.end());
  std::sort(w.begin(), w.end());
  const size_t n = w.size();
  return n % 2 ? w[n / 2] : 0.5 * (w[n / 2 - 1] + w[n / 2]);
}

std::string fmt(double v, int prec) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KB", "MB", "GB"};
  int u = 0;
  while (std::abs(b) >= 1000 && u < 3) b /= 1000, ++u;
  return fmt(b, u == 0 ? 0 : 2) + " " + unit[u];
}

void print_table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(header.size(), 0);
  for (size_t c = 0; c < header.size(); ++c) w[c] = header[c].size();
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const std::vector<std::string>& r) {
    for (size_t c = 0; c < w.size(); ++c) {
      std::string v = c < r.size() ? r[c] : "";
      std::cout << (c ? "  " : "") << (c ? std::string(w[c] - v.size(), ' ') + v : v + std::string(w[c] - v.size(), ' '));
    }
    std::cout << "\n";
  };
  line(header);
  size_t total = 0;
  for (auto x : w) total += x + 2;
  std::cout << std::string(total - 2, '-') << "\n";
  for (const auto& r : rows) line(r);
  std::cout << std::flush;
}

void write_json(const std::string& path, const json& j) {
  fs::path p(path);
  if (p.has_parent_path()) fs::create_directories(p.parent_path());
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << j.dump(2) << "\n";
  std::cout << "wrote " << path << "\n";
}

std::string default_config() { return paths().source_dir + "/bench/configs/gpt-bench.toml"; }

std::string now_iso() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace bench
