#include "plan/validate.h"

#include <smp/error.h>
#include <smp/process_env.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace smp::plan {

nlohmann::json candidate_json(const Candidate& k, const Shape& s) {
  nlohmann::json j = k.prediction.to_json();
  j["layout"] = k.layout.describe();
  j["sets"] = k.layout.sets(s);
  return j;
}

nlohmann::json validate_published(const Cluster& c, const nlohmann::json& published) {
  using nlohmann::json;
  json result = {{"cluster", c.name}, {"source", published.value("source", "")}, {"rows", json::array()}};
  double worst = 0;
  bool all = true;
  for (const json& row : published.at("rows")) {
    Shape s;
    s.layers = row.at("layers"), s.hidden = row.at("hidden"), s.heads = row.at("heads");
    s.seq = published.at("seq"), s.vocab = published.at("vocab"), s.batch = row.at("batch");
    s.dtype = published.value("dtype", "fp16");
    SearchOptions o;
    // In the int the search takes, as smp-plan --world is (a SIGFPE past it).
    for (const char* key : {"gpus", "tp", "pp"})
      if (!row.at(key).is_number_integer() || row.at(key).get<int64_t>() < 1 ||
          row.at(key).get<int64_t>() > kMaxWorldSize)
        throw Error(std::string("--validate: rows[].") + key + " is " + row.at(key).dump() +
                    ": expected an integer in [1, " + std::to_string(kMaxWorldSize) + "]");
    o.world = row.at("gpus");
    o.tp = row.at("tp"), o.pp = row.at("pp");
    o.zero_stages = {0};
    o.recompute = {true};
    o.overlap_dp = false;
    o.schedules = {"1f1b"};  // and interleaved, as the paper ran  // Megatron-LM reduced the gradients after the backward then
    const SearchResult given = search(c, s, o);
    SearchOptions free;
    free.world = o.world;
    const auto t0 = std::chrono::steady_clock::now();
    const SearchResult picked = search(c, s, free);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    json r = row;
    if (given.ranked.empty()) {
      r["predicted"] = nullptr;
      all = false;
    } else {
      const double predicted = given.ranked.front().prediction.tflops_per_device;
      const double error = predicted / row.at("tflops_per_gpu").get<double>() - 1;
      worst = std::max(worst, std::fabs(error));
      all = all && std::fabs(error) <= 0.15;
      r["predicted"] = candidate_json(given.ranked.front(), s);
      r["predicted_tflops_per_gpu"] = predicted;
      r["error"] = error;
      r["within_15_percent"] = std::fabs(error) <= 0.15;
    }
    r["search"] = {{"candidates", picked.candidates},
                   {"fitting", picked.fitting},
                   {"seconds", seconds},
                   {"best", picked.ranked.empty() ? json(nullptr) : candidate_json(picked.ranked.front(), s)}};
    result["rows"].push_back(r);
  }
  result["largest_abs_error"] = worst;
  result["all_within_15_percent"] = all;
  return result;
}

}  // namespace smp::plan
