// SMP_ELASTIC: what smp-launch tells every worker of an elastic job about the
// job's re-formations so far (each time the launchers lost or gained a node
// and restarted the workers on a new world):
//   {"round": 2, "reformations": [{"round": 1, "reason": "...",
//     "previous_world": 4, "world": 2, "nodes": ["a"], "layout": ["parallel.dp=2"],
//     "noticed_unix": 1765000000.1, "resumed_step": 10, "first_step_seconds": 7.2}, ...]}
// Round 0 is the first start (no entry); the current round's entry (round ==
// the top-level round) lacks resumed_step and first_step_seconds, which the
// trainer fills in after this run's first step (metrics.jsonl's "reform"
// event, summary.json's "elastic").
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace smp {

inline constexpr size_t kMaxElasticEnvBytes = 64 * 1024;

struct ElasticReformation {
  int64_t round = 0;
  std::string reason;
  int64_t previous_world = 0, world = 0;
  std::vector<std::string> nodes, layout;  // the surviving nodes; the layout's settings
  double noticed_unix = 0;                 // when a launcher noticed the change (seconds since 1970)
  std::optional<int64_t> resumed_step;     // the steps done when the new world's run started
  std::optional<double> first_step_seconds;  // noticed -> the new world's first step done

  // Every field; resumed_step and first_step_seconds null while unknown.
  nlohmann::json to_json() const;
};

struct ElasticRecord {
  int64_t round = 0;
  std::vector<ElasticReformation> reformations;

  // The entry of `round` (nullptr in round 0).
  ElasticReformation* current();
  const ElasticReformation* current() const;
  // {"round": R, "reformations": [...]}
  nlohmann::json to_json() const;
};

// The record in `text` (SMP_ELASTIC's value); nullopt without one (text null
// or empty) or when it is unusable, then with *warning (when given) naming
// SMP_ELASTIC and what is wrong: longer than kMaxElasticEnvBytes, not JSON,
// a field missing or of the wrong type, no entry for a round above 0.
// Required: round (integer >= 0), reformations (array); in each entry round
// (1..round), previous_world and world (integers >= 0), noticed_unix (a
// finite number). Optional: reason (string), nodes and layout (arrays of
// strings), resumed_step (integer >= 0), first_step_seconds (finite number).
// Never throws.
std::optional<ElasticRecord> parse_elastic_env(const char* text, std::string* warning);

}  // namespace smp
