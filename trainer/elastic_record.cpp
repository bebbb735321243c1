#include "elastic_record.h"

#include <cmath>
#include <cstring>
#include <stdexcept>

namespace smp {

namespace {

using nlohmann::json;

// A field that cannot be read: its name in the message.
struct Bad : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const json* field(const json& o, const char* key, const std::string& where, bool required) {
  const auto it = o.find(key);
  if (it == o.end()) {
    if (required) throw Bad(where + key + " is missing");
    return nullptr;
  }
  return &*it;
}

int64_t integer(const json& o, const char* key, const std::string& where, int64_t min, int64_t max) {
  const json& v = *field(o, key, where, true);
  if (!v.is_number_integer()) throw Bad(where + key + " is a " + v.type_name() + ", not an integer");
  const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(max)
                                               : v.get<int64_t>() >= min && v.get<int64_t>() <= max;
  if (!in_range || v.get<int64_t>() < min)
    throw Bad(where + key + " is out of range (" + std::to_string(min) + ".." + std::to_string(max) + ")");
  return v.get<int64_t>();
}

double number(const json& v, const char* key, const std::string& where) {
  if (!v.is_number()) throw Bad(where + key + " is a " + std::string(v.type_name()) + ", not a number");
  const double x = v.get<double>();
  if (!std::isfinite(x)) throw Bad(where + key + " is not finite");
  return x;
}

std::vector<std::string> strings(const json& o, const char* key, const std::string& where) {
  std::vector<std::string> out;
  const json* v = field(o, key, where, false);
  if (!v) return out;
  if (!v->is_array()) throw Bad(where + key + " is a " + std::string(v->type_name()) + ", not an array of strings");
  for (const json& s : *v) {
    if (!s.is_string()) throw Bad(where + key + " holds a " + std::string(s.type_name()) + ", not a string");
    out.push_back(s.get<std::string>());
  }
  return out;
}

constexpr int64_t kMaxCount = int64_t{1} << 40;

ElasticReformation entry(const json& e, const std::string& where, int64_t max_round) {
  if (!e.is_object()) throw Bad(where + " is a " + std::string(e.type_name()) + ", not an object");
  const std::string at = where + ".";
  ElasticReformation r;
  r.round = integer(e, "round", at, 1, max_round);
  if (const json* v = field(e, "reason", at, false)) {
    if (!v->is_string()) throw Bad(at + "reason is a " + std::string(v->type_name()) + ", not a string");
    r.reason = v->get<std::string>();
  }
  r.previous_world = integer(e, "previous_world", at, 0, kMaxCount);
  r.world = integer(e, "world", at, 0, kMaxCount);
  r.nodes = strings(e, "nodes", at);
  r.layout = strings(e, "layout", at);
  r.noticed_unix = number(*field(e, "noticed_unix", at, true), "noticed_unix", at);
  if (const json* v = field(e, "resumed_step", at, false); v && !v->is_null())
    r.resumed_step = integer(e, "resumed_step", at, 0, kMaxCount);
  if (const json* v = field(e, "first_step_seconds", at, false); v && !v->is_null())
    r.first_step_seconds = number(*v, "first_step_seconds", at);
  return r;
}

}  // namespace

json ElasticReformation::to_json() const {
  return {{"round", round},
          {"reason", reason},
          {"previous_world", previous_world},
          {"world", world},
          {"nodes", nodes},
          {"layout", layout},
          {"noticed_unix", noticed_unix},
          {"resumed_step", resumed_step ? json(*resumed_step) : json(nullptr)},
          {"first_step_seconds", first_step_seconds ? json(*first_step_seconds) : json(nullptr)}};
}

ElasticReformation* ElasticRecord::current() {
  for (auto& r : reformations)
    if (r.round == round) return &r;
  return nullptr;
}

const ElasticReformation* ElasticRecord::current() const { return const_cast<ElasticRecord*>(this)->current(); }

json ElasticRecord::to_json() const {
  json all = json::array();
  for (const auto& r : reformations) all.push_back(r.to_json());
  return {{"round", round}, {"reformations", all}};
}

std::optional<ElasticRecord> parse_elastic_env(const char* text, std::string* warning) {
  auto refuse = [&](const std::string& why) -> std::optional<ElasticRecord> {
    if (warning) *warning = "SMP_ELASTIC: " + why + "; the re-formation record is ignored";
    return std::nullopt;
  };
  if (warning) warning->clear();
  if (!text || !*text) return std::nullopt;
  const size_t n = ::strnlen(text, kMaxElasticEnvBytes + 1);
  if (n > kMaxElasticEnvBytes)
    return refuse("longer than " + std::to_string(kMaxElasticEnvBytes) + " bytes");
  try {
    // Nesting bounded: no record nests deeper than 3 levels.
    bool too_deep = false;
    const json j = json::parse(
        text, text + n,
        [&](int depth, json::parse_event_t, json&) {
          if (depth > 8) too_deep = true;
          return !too_deep;
        },
        /*allow_exceptions=*/false);
    if (too_deep) return refuse("nested deeper than 8 levels");
    if (j.is_discarded()) return refuse("not JSON");
    if (!j.is_object()) return refuse("a " + std::string(j.type_name()) + ", not a JSON object");
    ElasticRecord rec;
    rec.round = integer(j, "round", "", 0, kMaxCount);
    const json& all = *field(j, "reformations", "", true);
    if (!all.is_array()) throw Bad("reformations is a " + std::string(all.type_name()) + ", not an array");
    for (size_t i = 0; i < all.size(); ++i)
      rec.reformations.push_back(entry(all[i], "reformations[" + std::to_string(i) + "]", rec.round));
    if (rec.round > 0 && !rec.current())
      return refuse("reformations has no entry for the current round " + std::to_string(rec.round));
    return rec;
  } catch (const Bad& e) {
    return refuse(e.what());
  } catch (const std::exception& e) {  // not expected: nothing above throws otherwise
    return refuse(e.what());
  }
}

}  // namespace smp
