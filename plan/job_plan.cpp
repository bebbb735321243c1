#include "plan/job_plan.h"

#include "plan/job_shape.h"
#include "plan/validate.h"

#include <smp/plan.h>

#include <smp/config.h>
#include <smp/error.h>
#include <smp/process_env.h>
#include <smp/runtime.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <sstream>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <algorithm>
#include <utility>

namespace smp::plan {

namespace {

using nlohmann::json;

// The ranked layouts smp's memory estimate keeps under the accelerator's
// memory, `top` at most, each with that estimate as its memory.
SearchResult checked_by_smp(const SearchResult& ranked, const Cluster& c, const JobFile& job, int world, size_t top,
                            const Shape& s, int64_t* left_out) {
  SearchResult kept = ranked;
  kept.ranked.clear();
  *left_out = 0;
  for (const Candidate& k : ranked.ranked) {
    if (kept.ranked.size() >= top) break;
    std::vector<std::string> with = job.sets;
    for (const std::string& set : k.layout.sets(s)) with.push_back(set);
    const json estimate = Runtime::estimate_memory(Config::load(job.config, with), world, {job.plugin});
    Candidate checked = k;
    checked.prediction.memory_bytes = estimate.at("max_total_bytes").get<double>();
    checked.prediction.fits = checked.prediction.memory_bytes <= c.memory_bytes;
    if (checked.prediction.fits)
      kept.ranked.push_back(checked);
    else
      ++*left_out;
  }
  return kept;
}

}  // namespace

void check_shape(const Shape& s) {
  for (const auto& [name, v] : {std::pair<const char*, int64_t>{"--layers", s.layers}, {"--hidden", s.hidden},
                                {"--heads", s.heads}, {"--seq", s.seq}, {"--vocab", s.vocab}, {"--batch", s.batch}})
    if (v <= 0) throw Error(std::string(name) + " is required (the model's shape)");
  if (s.hidden % s.heads != 0)  // a head size of 0 (hidden 16, 2048 heads) ranked layouts before
    throw Error("--hidden " + std::to_string(s.hidden) + " is not a multiple of --heads " + std::to_string(s.heads) +
                " (the heads split the hidden size)");
}

Plan make_plan(const Cluster& c, const Shape& s, const SearchOptions& o, size_t top, const JobFile& job) {
  Plan p;
  p.shape = s;
  const auto t0 = std::chrono::steady_clock::now();
  p.result = search(c, s, o);
  p.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!job.config.empty()) p.result = checked_by_smp(p.result, c, job, o.world, top, s, &p.left_out);
  return p;
}

json plan_json(const Cluster& c, const Plan& p, size_t top, const JobFile& job) {
  const Shape& s = p.shape;
  json j = {{"cluster", c.name}, {"candidates", p.result.candidates}, {"fitting", p.result.fitting},
            {"search_seconds", p.search_seconds},
            {"memory", job.config.empty() ? "the planner's" : "smp's estimate"},
            {"left_out_by_smps_estimate", p.left_out}, {"top", json::array()},
            {"shape",
             {{"layers", s.layers}, {"hidden", s.hidden}, {"heads", s.heads}, {"seq", s.seq}, {"vocab", s.vocab},
              {"ffn", s.ffn_size()}, {"kv_heads", s.kv_heads_or_heads()}, {"gated_mlp", s.gated_mlp},
              {"moe_layers", s.moe_layers}, {"experts", s.experts}, {"top_k", s.top_k},
              {"expert_ffn", s.expert_ffn}, {"shared_experts", s.shared_experts}, {"batch", s.batch},
              {"dtype", s.dtype}}}};
  for (size_t i = 0; i < std::min(top, p.result.ranked.size()); ++i)
    j["top"].push_back(candidate_json(p.result.ranked[i], s));
  return j;
}

std::string no_layout_reason(const Cluster& c, const Plan& p, int world) {
  if (p.result.candidates == 0)  // nothing to fit: the world, the options or the model admit no layout at all
    return "no layout of " + std::to_string(world) + " ranks exists for this model and these options (the sizes "
           "--tp, --pp, ... give must divide the world, the heads and the layers)";
  std::ostringstream gb;
  gb << c.memory_bytes / 1e9;  // as smp-plan has always printed it (an ostream's default)
  return "no layout fits " + gb.str() + " GB per accelerator";
}

std::vector<std::string> planning_sets(const std::vector<std::string>& sets) {
  std::vector<std::string> with = sets;
  with.push_back("parallel.layout=\"manual\"");
  return with;
}

json plan_job(const JobRequest& r) {
  if (r.world < 1 || r.world > kMaxWorldSize)
    throw Error("world " + std::to_string(r.world) + ": expected 1 to " + std::to_string(kMaxWorldSize) +
                " accelerators");
  if (r.cluster.empty()) throw Error("the plan needs a cluster (a preset name or a cluster file)");
  if (r.config.empty()) throw Error("the plan needs the job's file");
  if (r.top < 1) throw Error("the plan ranks at least one layout (top " + std::to_string(r.top) + ")");
  const Cluster c = load_cluster(r.cluster);
  const JobFile job{r.config, r.plugin, planning_sets(r.sets)};
  SearchOptions o;
  o.world = r.world, o.tp = r.tp, o.pp = r.pp, o.ep = r.ep;
  const Shape s = shape_of_job(Config::load(job.config, job.sets), o.world, job.plugin);
  check_shape(s);
  const Plan p = make_plan(c, s, o, r.top, job);
  if (p.result.ranked.empty()) throw Error(no_layout_reason(c, p, o.world));
  return plan_json(c, p, r.top, job);
}

}  // namespace smp::plan

namespace {

// The core's log lines while it builds the job's graph (the adapter's data,
// the stages), silenced for the C door's caller: smp-launch never printed
// them (it read smp-plan's output), and a plan is not a run.
class QuietLog {
 public:
  QuietLog() : logger_(spdlog::default_logger()), level_(logger_->level()) { logger_->set_level(spdlog::level::off); }
  ~QuietLog() { logger_->set_level(level_); }
  QuietLog(const QuietLog&) = delete;
  QuietLog& operator=(const QuietLog&) = delete;

 private:
  std::shared_ptr<spdlog::logger> logger_;
  spdlog::level::level_enum level_;
};

char* copied(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) char* smp_plan_job_json(const char* request, int* ok) {
  *ok = 0;
  try {
    const nlohmann::json j = nlohmann::json::parse(request ? request : "");
    smp::plan::JobRequest r;
    r.cluster = j.value("cluster", std::string());
    r.world = j.value("world", 1);
    r.config = j.value("config", std::string());
    r.plugin = j.value("plugin", std::string("gpt"));
    r.sets = j.value("sets", std::vector<std::string>());
    r.top = j.value("top", size_t{5});
    r.tp = j.value("tp", 0), r.pp = j.value("pp", 0), r.ep = j.value("ep", 0);
    const QuietLog quiet;
    std::string out = smp::plan::plan_job(r).dump(2);
    *ok = 1;
    return copied(out);
  } catch (const std::exception& e) {
    return copied(e.what());
  }
}
