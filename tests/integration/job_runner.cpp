#include "job_runner.h"

#include <limits>

#include <smp/process_env.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sys/wait.h>

namespace smp::testing {

namespace fs = boost::filesystem;

std::vector<double> losses_of(const JobResult& r) { return r.summary["losses"].get<std::vector<double>>(); }

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  // Lists of different lengths (a run that stopped early, or none at all) are
  // as far apart as can be: the comparison must not pass on the common prefix.
  if (a.size() != b.size() || a.empty()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::abs(b[i]));
  return worst;
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string source_path(const std::string& relative) { return std::string(SMP_SOURCE_DIR) + "/" + relative; }

std::string plugin_path(const std::string& name) {
  for (const std::string dir : {std::string(SMP_PLUGIN_DIR), std::string(SMP_TEST_PLUGIN_DIR)}) {
    fs::path p = fs::path(dir) / (name + ".so");
    if (fs::exists(p)) return p.string();
  }
  return name;
}

namespace {
std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace

JobResult run_job(int nproc, const std::string& plugin, const std::string& config, std::vector<std::string> overrides,
                  const std::vector<std::string>& launcher_args) {
  JobResult r;
  for (const auto& o : overrides)
    if (o.rfind("run.dir=", 0) == 0) r.run_dir = o.substr(8);
  if (r.run_dir.empty()) {
    r.run_dir = (fs::temp_directory_path() / fs::unique_path("smp-job-%%%%-%%%%-%%%%")).string();
    overrides.push_back("run.dir=" + r.run_dir);
  }
  std::string cmd;
  // The port is free when chosen, but a job of another test running at the same
  // time can take it before rank 0 binds it: then the rendezvous fails with
  // EADDRINUSE ("Address already in use") before anything ran, and the job is
  // started again on a new port. (The state worker also uses the next two ports.)
  for (int attempt = 0; attempt < 3; ++attempt) {
    cmd = quote(std::string(SMP_BIN_DIR) + "/smp-launch") + " --nproc-per-node " + std::to_string(nproc) +
          " --master-port " + std::to_string(find_free_port());
    for (const auto& a : launcher_args) cmd += " " + quote(a);
    cmd += " --plugin " + quote(plugin) + " --config " + quote(config);
    for (const auto& o : overrides) cmd += " --set " + quote(o);
    cmd += " 2>&1";
    r.output.clear();
    FILE* pipe = popen(cmd.c_str(), "r");
    std::array<char, 4096> buf{};
    while (pipe && fgets(buf.data(), buf.size(), pipe)) r.output += buf.data();
    int status = pipe ? pclose(pipe) : -1;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r.exit_code == 0 || (r.output.find("EADDRINUSE") == std::string::npos &&
                             r.output.find("Address already in use") == std::string::npos))
      break;
  }
  std::ifstream in(r.run_dir + "/summary.json");
  if (in) r.summary = nlohmann::json::parse(in);
  r.output = "$ " + cmd + "\n" + r.output;
  return r;
}

std::map<std::string, at::Tensor> assemble_parameters(const std::string& run_dir, double tol, std::string* problem,
                                                      const std::string& folder) {
  struct Piece {
    int dp, tp, tp_size, pp, shard_dim;
    at::Tensor t;
    int ep = 0, ep_size = 1, ep_shard_dim = -1;  // experts: sharded over ep (dp % ep)
  };
  std::map<std::string, std::vector<Piece>> pieces;
  for (auto& e : fs::directory_iterator(fs::path(run_dir) / folder)) {
    std::ifstream in(e.path().string());
    auto j = nlohmann::json::parse(in);
    for (auto& p : j["parameters"]) {
      auto data = p["data"].get<std::vector<double>>();
      at::Tensor t = at::tensor(data, at::kDouble).reshape(p["shape"].get<std::vector<int64_t>>());
      pieces[p["name"]].push_back({j["dp"], j["tp"], j["tp_size"], j["pp"], p["shard_dim"], t, j.value("ep", 0),
                                   j.value("ep_size", 1), p.value("ep_shard_dim", -1)});
    }
  }
  std::map<std::string, at::Tensor> full;
  auto note = [&](const std::string& msg) {
    if (problem && problem->empty()) *problem = msg;
  };
  for (auto& [name, ps] : pieces) {
    if (ps.front().ep_shard_dim >= 0) {  // an expert: dp ranks [0, ep) hold its ep slices
      const int ep_size = ps.front().ep_size, dim = ps.front().ep_shard_dim;
      const int tp_size = ps.front().tp_size, tp_dim = ps.front().shard_dim;  // expert tensor parallelism
      std::vector<std::vector<at::Tensor>> parts(ep_size, std::vector<at::Tensor>(tp_size));
      for (auto& p : ps)
        if (p.dp < ep_size) parts[p.ep][p.tp] = p.t;
      std::vector<at::Tensor> slices(ep_size);
      for (int e = 0; e < ep_size; ++e)
        slices[e] = tp_dim >= 0 ? at::cat(parts[e], tp_dim) : parts[e][0];
      for (auto& p : ps) {
        const at::Tensor& expect = tp_dim >= 0 ? parts[p.ep][p.tp] : slices[p.ep];
        if (!expect.defined() || expect.sizes() != p.t.sizes()) {
          note(name + ": expert slice shapes differ");
          continue;
        }
        double d = (expect - p.t).abs().max().item<double>();
        if (d > tol) note(name + ": expert replica at dp " + std::to_string(p.dp) + " differs by " + std::to_string(d));
      }
      full[name] = at::cat(slices, dim);
      continue;
    }
    const int tp_size = ps.front().tp_size;
    const int shard_dim = ps.front().shard_dim;
    // Reference replica: dp 0, lowest pp rank holding it.
    int ref_pp = 1 << 30;
    for (auto& p : ps)
      if (p.dp == 0) ref_pp = std::min(ref_pp, p.pp);
    std::vector<at::Tensor> shards(tp_size);
    for (auto& p : ps)
      if (p.dp == 0 && p.pp == ref_pp) shards[p.tp] = p.t;
    at::Tensor whole;
    if (shard_dim >= 0) {
      whole = at::cat(shards, shard_dim);
    } else {
      whole = shards[0];
    }
    for (auto& p : ps) {  // every replica must hold the same values
      at::Tensor expect = shard_dim >= 0 ? shards[p.tp] : whole;
      if (!expect.defined() || expect.sizes() != p.t.sizes()) {
        note(name + ": replica shapes differ");
        continue;
      }
      double d = (expect - p.t).abs().max().item<double>();
      if (d > tol)
        note(name + ": replica at dp " + std::to_string(p.dp) + " pp " + std::to_string(p.pp) + " tp " +
             std::to_string(p.tp) + " differs by " + std::to_string(d));
    }
    full[name] = whole;
  }
  return full;
}

}  // namespace smp::testing
