// Config: TOML (toml++) + --set overrides, validated against the schema below.
#include <smp/config.h>
#include <smp/error.h>
#include <smp/job_config.h>
#include <smp/axis_role.h>

#include "base/axis_names.h"
#include "base/pipeline_limits.h"
#include "base/table_names.h"

#include <smp/common/toml_nesting.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <fstream>
#include <sstream>

namespace smp {
namespace {

using nlohmann::json;

// AxisSizes: a table of axis name -> size; AxisJoins: axis name -> dimension names.
enum class Type { Int, Double, Bool, String, StringArray, IntArray, AxisSizes, AxisJoins };

// What a value must satisfy beyond its type.
enum class Rule { None, Positive, NonNegative, PositiveReal, NonNegativeReal, UnitInterval, ShmMiB, BucketMiB,
                  PositiveSeconds, NonNegativeSeconds,
                  Schedule, Placement, Device, Precision, CudaBackend, P2pSemantics, ZeroStage, ShardName, LayoutMode, CpMode, DecayOn };

enum class Presence { Default, Derived };

struct KeySpec {
  const char* key;
  Type type;
  json def;  // null = no default (parallel.dp: derived; memory.shard: another way to say parallel.zero)
  Rule rule;
  const char* doc;  // one line for the key reference (docs/config-reference.md, generated)
  // An integer key: the largest value its C++ field holds (an int key's value
  // is refused past INT_MAX rather than wrapped when JobConfig reads it).
  int64_t int_most = std::numeric_limits<int64_t>::max();
};

// The schema type of a typed field's C++ type (config_keys.h), and its default as JSON.
template <class T> constexpr Type type_of();
template <> constexpr Type type_of<int>() { return Type::Int; }
template <> constexpr Type type_of<int64_t>() { return Type::Int; }
template <> constexpr Type type_of<uint64_t>() { return Type::Int; }
template <> constexpr Type type_of<double>() { return Type::Double; }
template <> constexpr Type type_of<bool>() { return Type::Bool; }
template <> constexpr Type type_of<std::string>() { return Type::String; }
template <> constexpr Type type_of<Strings>() { return Type::StringArray; }
template <> constexpr Type type_of<Ints>() { return Type::IntArray; }
template <> constexpr Type type_of<DeviceList>() { return Type::IntArray; }
template <> constexpr Type type_of<AxisSizes>() { return Type::AxisSizes; }
template <> constexpr Type type_of<AxisJoins>() { return Type::AxisJoins; }
template <> constexpr Type type_of<Precision>() { return Type::String; }
template <> constexpr Type type_of<DeviceKind>() { return Type::String; }

template <class T> constexpr int64_t int_most_of() {
  return std::is_same_v<T, int> ? std::numeric_limits<int>::max() : std::numeric_limits<int64_t>::max();
}

template <class T> json default_json(const T& v) { return json(v); }
json default_json(const AxisSizes& v) {
  json o = json::object();
  for (const auto& [name, size] : v) o[name] = size;
  return o;
}
json default_json(const AxisJoins& v) {
  json o = json::object();
  for (const auto& [name, dims] : v) o[name] = dims;
  return o;
}
json default_json(Precision v) { return to_string(v); }
json default_json(DeviceKind v) { return to_string(v); }

// The schema: every key a job file may set outside the free-form and plugin
// tables, generated from the lists in config_keys.h.
const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> s = [] {
    std::vector<KeySpec> out;
#define SMP_SCHEMA_ENTRY(field, key, type, check, def, presence, doc) \
  out.push_back({key, type_of<type>(), Presence::presence == Presence::Derived ? json(nullptr) : default_json(type(def)), \
                 Rule::check, doc, int_most_of<type>()});
#define SMP_SCHEMA_TABLE(group, list) list(SMP_SCHEMA_ENTRY)
    SMP_CONFIG_TABLES(SMP_SCHEMA_TABLE)
#undef SMP_SCHEMA_TABLE
#undef SMP_SCHEMA_ENTRY
    return out;
  }();
  return s;
}


// Keys that moved to a plugin's table, for the message that refuses the old name.
const char* moved_to(const std::string& key) {
  if (key == "parallel.sequence_parallel") return "tp.sequence_parallel (the [tp] table of the smp_tp plugin)";
  return nullptr;
}

const KeySpec* find_spec(const std::string& key) {
  for (const auto& s : schema())
    if (key == s.key) return &s;
  return nullptr;
}

std::string head_of(const std::string& key) { return key.substr(0, key.find('.')); }


[[noreturn]] void unknown_key(const std::string& origin, const std::string& key) {
  std::string msg = origin + ": unknown key '" + key + "'";
  if (const char* to = moved_to(key)) throw Error(msg + ": it moved to " + to);
  const KeySpec* best = nullptr;
  size_t best_d = 3;
  for (const auto& s : schema()) {
    size_t d = edit_distance(key, s.key);
    if (d < best_d) best_d = d, best = &s;
  }
  if (best) msg += " (did you mean '" + std::string(best->key) + "'?)";
  else if (key.find('.') != std::string::npos && is_schema_table(head_of(key)))
    msg += " (see the [" + head_of(key) + "] keys in the documentation)";
  else if (key.find('.') == std::string::npos)
    msg += " (expected one of the tables " + core_tables_text() + ")";
  throw Error(msg);
}

// A value rendered for messages: strings in double quotes, tables as "a table".
std::string render(const json& j) {
  if (j.is_object()) return "a table";
  return j.dump();
}
json to_json_value(const toml::node& n);
std::string render(const toml::node& n) { return render(to_json_value(n)); }

// Whether a string value is one of `names`.
bool one_of(const json& v, std::initializer_list<const char*> names) {
  const auto& s = v.get_ref<const std::string&>();
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return s == n; });
}

const char* expectation(Type t, Rule r) {
  switch (r) {
    case Rule::Positive: return "expected a positive integer";
    case Rule::NonNegative: return "expected a non-negative integer";
    case Rule::PositiveReal: return "expected a number > 0";
    case Rule::NonNegativeReal: return "expected a number >= 0";
    case Rule::BucketMiB: return "expected a number of MiB in [0, 1048576]";
    case Rule::PositiveSeconds: return "expected a number of seconds in (0, 1e9]";
    case Rule::NonNegativeSeconds: return "expected 0 or a number of seconds in (0, 1e9]";
    case Rule::UnitInterval: return "expected a number in [0, 1)";
    case Rule::ShmMiB: return "expected 0 (everything through Gloo) or a number of MiB in [0.001, 65536]";
    case Rule::Schedule:
      return "expected one of \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"zb-h1\" "
             "(or the aliases \"simple\", \"interleaved\")";
    case Rule::Placement:
      return "expected a permutation of \"pp,dp,tp\", \"cp\" with parallel.cp and any axes of parallel.axes "
             "(slowest- to fastest-varying), "
             "or \"cluster\"/\"spread\"";
    case Rule::Device: return "expected one of \"auto\", \"cpu\", \"cuda\"";
    case Rule::LayoutMode: return "expected one of \"manual\", \"auto\", \"planned\"";
    case Rule::CpMode: return "expected one of \"ring\", \"alltoall\"";
    case Rule::DecayOn: return "expected one of \"matrices\", \"all\"";
    case Rule::Precision: return "expected one of \"fp32\", \"bf16\", \"fp16\"";
    case Rule::CudaBackend: return "expected one of \"auto\", \"nccl\", \"gloo\"";
    case Rule::P2pSemantics: return "expected one of \"buffered\", \"rendezvous\"";
    case Rule::ZeroStage: return "expected 0, 1, 2 or 3";
    case Rule::ShardName: return "expected one of \"none\", \"optimizer\", \"gradients\", \"parameters\"";
    case Rule::None: break;
  }
  switch (t) {
    case Type::Int: return "expected an integer";
    case Type::Double: return "expected a number";
    case Type::Bool: return "expected a boolean (true or false)";
    case Type::String: return "expected a string";
    case Type::StringArray: return "expected an array of strings";
    case Type::IntArray: return "expected an array of integers";
    case Type::AxisSizes:
      return "expected a table of axis names (lower-case letters, digits, '_'; not pp, dp, tp, ep, edp, mp or "
             "world) to positive integers";
    case Type::AxisJoins:
      return "expected a table of axis names (lower-case letters, digits, '_'; not a core axis) to arrays of two "
             "or more dimension names";
  }
  return "expected a value";
}

std::string trim(std::string s) {
  auto issp = [](unsigned char c) { return std::isspace(c) != 0; };
  while (!s.empty() && issp(s.back())) s.pop_back();
  size_t i = 0;
  while (i < s.size() && issp(s[i])) ++i;
  return s.substr(i);
}

// "simple" -> "gpipe", "interleaved" -> "1f1b" (SMP v1 names); "" when invalid.
std::string normalise_schedule(const std::string& s) {
  if (s == "gpipe" || s == "1f1b" || s == "interleaved-1f1b" || s == "zb-h1") return s;
  if (s == "simple") return "gpipe";
  if (s == "interleaved") return "1f1b";
  return "";
}

// The core's own dimensions every mesh has (pp, dp, tp: MeshSpec's list).
bool in_every_mesh(const std::string& name) {
  const BuiltinAxis* b = builtin_axis(name);
  return b && b->in_every_mesh;
}

// The name of the built-in axis that is in every mesh and has `role`.
std::string builtin_dimension(Role role) {
  for (const BuiltinAxis& b : builtin_axes())
    if (b.in_every_mesh && b.role == role) return b.name;
  return "";
}

// A name the core reserves, which a job may not declare (parallel.axes,
// parallel.flatten). The built-in sequence axis is refused later, by
// resolve_layout, naming the key that sets it.
bool reserved_axis(const std::string& name) {
  const BuiltinAxis* b = builtin_axis(name);
  return b && b->role != Role::Sequence;
}

// Placement "cluster"/"spread"/"pp, dp, tp" -> "pp,dp,tp"; "" when invalid.
// Names beyond pp, dp and tp are checked against parallel.axes by resolve_layout.
std::string normalise_placement(const std::string& s) {
  if (s == "cluster") return "pp,dp,tp";
  if (s == "spread") return "pp,tp,dp";
  const std::vector<std::string> parts = split_names(s);
  std::string out;
  for (const auto& p : parts) {
    if (!is_axis_name(p) || std::count(parts.begin(), parts.end(), p) > 1) return "";
    if (const BuiltinAxis* b = builtin_axis(p); b && !is_dimension(b->role)) return "";  // a derived axis
    out += (out.empty() ? "" : ",") + p;
  }
  for (const BuiltinAxis& b : builtin_axes())
    if (b.in_every_mesh && std::find(parts.begin(), parts.end(), b.name) == parts.end()) return "";
  return out;
}

// TOML -> JSON (dates and times become strings).
json to_json_value(const toml::node& n) {
  if (auto t = n.as_table()) {
    json o = json::object();
    for (auto&& [k, v] : *t) o[std::string(k.str())] = to_json_value(v);
    return o;
  }
  if (auto a = n.as_array()) {
    json arr = json::array();
    for (auto&& v : *a) arr.push_back(to_json_value(v));
    return arr;
  }
  if (auto v = n.as_integer()) return v->get();
  if (auto v = n.as_floating_point()) return v->get();
  if (auto v = n.as_boolean()) return v->get();
  if (auto v = n.as_string()) return v->get();
  std::ostringstream os;
  n.visit([&](auto&& x) { os << x; });
  return os.str();
}

// Whether `v` (of the key's type) meets `rule`; normalises names in place.
bool meets_rule(Rule rule, json& v) {
  switch (rule) {
    case Rule::None: break;
    case Rule::Positive:
      if (v.get<int64_t>() < 1) return false;
      break;
    case Rule::NonNegative:
      if (v.get<int64_t>() < 0) return false;
      break;
    case Rule::PositiveReal:
      if (!(v.get<double>() > 0) || !std::isfinite(v.get<double>())) return false;
      break;
    case Rule::NonNegativeReal:
      if (!(v.get<double>() >= 0) || !std::isfinite(v.get<double>())) return false;
      break;
    // Sizes and durations are made bytes and milliseconds in an int64_t: bounded
    // so that the product cannot overflow (1e300 wrapped to a negative timeout).
    case Rule::BucketMiB:
      if (!(v.get<double>() >= 0 && v.get<double>() <= 1048576)) return false;
      break;
    case Rule::PositiveSeconds:
      if (!(v.get<double>() > 0 && v.get<double>() <= 1e9)) return false;
      break;
    case Rule::NonNegativeSeconds:
      if (!(v.get<double>() >= 0 && v.get<double>() <= 1e9)) return false;
      break;
    case Rule::UnitInterval:
      if (!(v.get<double>() >= 0 && v.get<double>() < 1)) return false;
      break;
    case Rule::ShmMiB:  // MiB made bytes in an int64_t (CommConfig::shm_slot_bytes), times the ranks of a host
      if (!(v.get<double>() == 0 || (v.get<double>() >= 0.001 && v.get<double>() <= 65536))) return false;
      break;
    case Rule::Schedule: {
      std::string s = normalise_schedule(v.get<std::string>());
      if (s.empty()) return false;
      v = s;
      break;
    }
    case Rule::Placement: {
      std::string s = normalise_placement(v.get<std::string>());
      if (s.empty()) return false;
      v = s;
      break;
    }
    case Rule::Device:
      if (!one_of(v, {"auto", "cpu", "cuda"})) return false;
      break;
    case Rule::LayoutMode:
      if (!one_of(v, {"manual", "auto", "planned"})) return false;
      break;
    case Rule::CpMode:
      if (!one_of(v, {"ring", "alltoall"})) return false;
      break;
    case Rule::DecayOn:
      if (!one_of(v, {"matrices", "all"})) return false;
      break;
    case Rule::Precision:
      if (!one_of(v, {"fp32", "bf16", "fp16"})) return false;
      break;
    case Rule::CudaBackend:
      if (!one_of(v, {"auto", "nccl", "gloo"})) return false;
      break;
    case Rule::P2pSemantics:
      if (!one_of(v, {"buffered", "rendezvous"})) return false;
      break;
    case Rule::ZeroStage:
      if (v.get<int64_t>() < 0 || v.get<int64_t>() > 3) return false;
      break;
    case Rule::ShardName:
      if (!one_of(v, {"none", "optimizer", "gradients", "parameters"})) return false;
      break;
  }
  return true;
}

// Checks one schema value; returns it normalised. Throws naming origin and key.
json check_value(const std::string& origin, const KeySpec& spec, const toml::node& n) {
  auto fail = [&]() -> json {
    throw Error(origin + ": " + spec.key + ": " + expectation(spec.type, spec.rule) + ", got " + render(n));
  };
  json v;
  switch (spec.type) {
    case Type::Int:
      if (!n.is_integer()) return fail();
      if (n.as_integer()->get() > spec.int_most)
        throw Error(origin + ": " + spec.key + ": " + expectation(spec.type, spec.rule) + " of at most " +
                    std::to_string(spec.int_most) + ", got " + render(n));
      v = n.as_integer()->get();
      break;
    case Type::Double:
      if (n.is_integer()) v = static_cast<double>(n.as_integer()->get());
      else if (n.is_floating_point()) v = n.as_floating_point()->get();
      else return fail();
      if (!std::isfinite(v.get<double>())) return fail();
      break;
    case Type::Bool:
      if (!n.is_boolean()) return fail();
      v = n.as_boolean()->get();
      break;
    case Type::String:
      if (!n.is_string()) return fail();
      v = n.as_string()->get();
      break;
    case Type::StringArray: {
      if (!n.is_array()) return fail();
      v = json::array();
      for (auto&& e : *n.as_array()) {
        if (!e.is_string()) return fail();
        v.push_back(e.as_string()->get());
      }
      break;
    }
    case Type::IntArray: {
      if (!n.is_array()) return fail();
      v = json::array();
      for (auto&& e : *n.as_array()) {
        if (!e.is_integer() || e.as_integer()->get() < 0) return fail();
        v.push_back(e.as_integer()->get());
      }
      break;
    }
    case Type::AxisSizes:
    case Type::AxisJoins: {
      if (!n.is_table()) return fail();
      v = json::object();
      for (auto&& [k, e] : *n.as_table()) {
        const std::string name(k.str());
        if (!is_axis_name(name) || reserved_axis(name)) return fail();
        if (spec.type == Type::AxisSizes) {
          if (!e.is_integer() || e.as_integer()->get() < 1) return fail();
          v[name] = e.as_integer()->get();
          continue;
        }
        if (!e.is_array() || e.as_array()->size() < 2) return fail();
        v[name] = json::array();
        for (auto&& d : *e.as_array()) {
          if (!d.is_string()) return fail();
          v[name].push_back(d.as_string()->get());
        }
      }
      break;
    }
  }
  if (!meets_rule(spec.rule, v)) return fail();
  return v;
}

// Merges a parsed document into `values` (later wins), validating every key.
void merge_document(const std::string& origin, const toml::table& doc, json& values) {
  for (auto&& [k, node] : doc) {
    std::string table(k.str());
    if (is_free_table(table)) {
      if (!node.is_table())
        throw Error(origin + ": " + table + ": expected a table ([" + table + "]), got " + render(node));
      json j = to_json_value(node);
      if (!values.contains(table)) values[table] = json::object();
      values[table].merge_patch(j);
      continue;
    }
    if (!is_schema_table(table)) {
      // A table of a plugin (SMP_EXTENSION_CONFIG), or a mistake: kept as
      // written, and refused by name once the plugins are loaded when none owns it.
      if (!node.is_table() || !is_plugin_table_name(table)) unknown_key(origin, table);
      json j = to_json_value(node);
      if (!values.contains(table)) values[table] = json::object();
      values[table].merge_patch(j);
      continue;
    }
    if (!node.is_table())
      throw Error(origin + ": " + table + ": expected a table ([" + table + "]), got " + render(node));
    for (auto&& [sub, v] : *node.as_table()) {
      std::string key = table + "." + std::string(sub.str());
      const KeySpec* spec = find_spec(key);
      if (!spec) unknown_key(origin, key);
      values[table][std::string(sub.str())] = check_value(origin, *spec, v);
    }
  }
}

std::string describe_parse_error(const std::string& origin, const toml::parse_error& e) {
  std::ostringstream os;
  os << origin;
  const auto& src = e.source();
  if (src.begin.line) os << ":" << src.begin.line << ":" << src.begin.column;
  os << ": invalid TOML: " << e.description();
  return os.str();
}

// One override "a.b=value"; set_by[key] = the argument as messages name it.
void apply_override(const ConfigOverride& o, json& values, json& set_by) {
  const std::string& arg = o.key_value;
  const std::string origin = o.label + arg;
  auto eq = arg.find('=');
  if (eq == std::string::npos)
    throw Error(origin + ": malformed override, expected key=value (e.g. " + o.label + "train.steps=5)");
  std::string key = trim(arg.substr(0, eq));
  std::string text = trim(arg.substr(eq + 1));
  if (key.empty()) throw Error(origin + ": malformed override, the key before '=' is empty");
  std::vector<std::string> parts;
  {
    std::string cur;
    for (char c : key + ".") {
      if (c == '.') {
        if (trim(cur).empty()) throw Error(origin + ": malformed key '" + key + "'");
        parts.push_back(trim(cur));
        if (parts.size() > static_cast<size_t>(input::kMaxTomlDepth))
          throw Error(origin + ": the key has more than " + std::to_string(input::kMaxTomlDepth) +
                      " dotted parts (no job nests so)");
        cur.clear();
      } else {
        cur += c;
      }
    }
  }
  // The value as a TOML value; anything TOML can't parse is a plain string
  // (so --set parallel.schedule=gpipe works without quotes).
  toml::table holder;
  bool parsed = false;
  if (!text.empty()) {
    try {  // a value nested past the bound is refused, not parsed (the stack)
      input::check_toml_nesting("v = " + text, origin);
    } catch (const input::Error& e) {
      throw Error(e.what());
    }
    try {
      holder = toml::parse("v = " + text);
      parsed = holder.size() == 1 && holder.contains("v");
    } catch (const toml::parse_error&) {
      parsed = false;
    }
  }
  if (!parsed) {
    holder = toml::table{};
    holder.insert_or_assign("v", text);
  }
  const toml::node& node = *holder.get("v");

  const std::string& table = parts[0];
  if (parts.size() >= 2) set_by[parts[0] + "." + parts[1]] = origin;
  if (parts.size() < 2) {
    if (is_free_table(table) || is_schema_table(table))
      throw Error(origin + ": '" + key + "' is a table; set one of its keys, e.g. " + o.label + table + ".<key>=value");
    unknown_key(origin, key);
  }
  if (is_free_table(table) || is_plugin_table_name(table)) {
    json* cur = &values[table];
    if (!cur->is_object()) *cur = json::object();
    for (size_t i = 1; i + 1 < parts.size(); ++i) {
      json& next = (*cur)[parts[i]];
      if (!next.is_object()) next = json::object();
      cur = &next;
    }
    (*cur)[parts.back()] = to_json_value(node);
    return;
  }
  // One entry of a table-valued key: --set parallel.axes.tok=2.
  if (parts.size() == 3) {
    const KeySpec* outer = find_spec(table + "." + parts[1]);
    if (outer && (outer->type == Type::AxisSizes || outer->type == Type::AxisJoins)) {
      toml::table entry;
      entry.insert_or_assign(parts[2], node);
      json& cur = values[table][parts[1]];
      if (!cur.is_object()) cur = json::object();
      cur.update(check_value(origin, *outer, entry));
      return;
    }
  }
  const KeySpec* spec = find_spec(key);
  if (!spec) unknown_key(origin, key);
  values[table][parts[1]] = check_value(origin, *spec, node);
}

void build(const std::string& origin, const toml::table& doc, const std::vector<ConfigOverride>& overrides,
           json& values, json& set_by) {
  merge_document(origin, doc, values);
  for (const auto& o : overrides) apply_override(o, values, set_by);
}

}  // namespace

// A job file is read under the one discipline for files from outside
// (smp/sdk/input_file.hpp): a regular file of at most kMaxConfigBytes (a named
// pipe is refused, not waited on); its nesting is bounded by from_string.
Config Config::load(const std::string& path, const std::vector<std::string>& overrides) {
  std::vector<ConfigOverride> labelled;
  for (const std::string& o : overrides) labelled.push_back({o, "--set "});
  return load_labelled(path, labelled);
}

Config Config::load_labelled(const std::string& path, const std::vector<ConfigOverride>& overrides) {
  std::string text;
  try {
    text = input::read_file(path, path, input::kMaxConfigBytes);
  } catch (const input::Error& e) {
    throw Error(e.what());
  }
  return from_string_labelled(text, path, overrides);
}

Config Config::from_string(const std::string& text, const std::string& origin_name,
                           const std::vector<std::string>& overrides) {
  std::vector<ConfigOverride> labelled;
  for (const std::string& o : overrides) labelled.push_back({o, "--set "});
  return from_string_labelled(text, origin_name, labelled);
}

Config Config::from_string_labelled(const std::string& text, const std::string& origin_name,
                                    const std::vector<ConfigOverride>& overrides) {
  toml::table doc;
  try {
    input::check_toml_nesting(text, origin_name);
  } catch (const input::Error& e) {
    throw Error(e.what());
  }
  try {
    doc = toml::parse(text, origin_name);
  } catch (const toml::parse_error& e) {
    throw Error(describe_parse_error(origin_name, e));
  }
  Config c;
  c.origin_ = origin_name;
  build(origin_name, doc, overrides, c.values_, c.set_by_);
  return c;
}

const nlohmann::json* Config::find(const std::string& dotted_key) const {
  const json* cur = &values_;
  size_t start = 0;
  while (true) {
    size_t dot = dotted_key.find('.', start);
    std::string part = dotted_key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!cur->is_object()) return nullptr;
    auto it = cur->find(part);
    if (it == cur->end()) return nullptr;
    cur = &*it;
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

namespace {

// The value of a key (given or default) with its spec; throws for unknown keys.
const json& lookup(const std::string& origin, const json* given, const std::string& key, const KeySpec** spec_out) {
  const KeySpec* spec = find_spec(key);
  *spec_out = spec;
  if (!spec) {
    if (!is_free_table(head_of(key)) || key.find('.') == std::string::npos) unknown_key(origin, key);
    if (!given) throw Error(origin + ": " + key + ": missing (the [" + head_of(key) + "] table has no such key)");
    return *given;
  }
  if (given) return *given;
  if (spec->def.is_null())
    throw Error(origin + ": " + key + ": not set (it is derived by resolve_layout from the world size)");
  return spec->def;
}

// An array value whose every element has the array type's element type (a
// string, or an integer), else an error naming the key.
template <class T>
std::vector<T> array_value(const std::string& origin, const std::string& key, const json& v, Type type) {
  const auto element_ok = [type](const json& e) { return type == Type::IntArray ? e.is_number_integer() : e.is_string(); };
  std::vector<T> out;
  bool ok = v.is_array();
  if (ok)
    for (const auto& e : v) {
      if (!element_ok(e)) {
        ok = false;
        break;
      }
      out.push_back(e.get<T>());
    }
  if (!ok) throw Error(origin + ": " + key + ": " + expectation(type, Rule::None) + ", got " + render(v));
  return out;
}

}  // namespace

int64_t Config::get_int(const std::string& key) const {
  const KeySpec* spec;
  const json& v = lookup(origin_of(key), find(key), key, &spec);
  if (!v.is_number_integer()) throw Error(origin_of(key) + ": " + key + ": expected an integer, got " + render(v));
  return v.get<int64_t>();
}

double Config::get_double(const std::string& key) const {
  const KeySpec* spec;
  const json& v = lookup(origin_of(key), find(key), key, &spec);
  if (!v.is_number()) throw Error(origin_of(key) + ": " + key + ": expected a number, got " + render(v));
  return v.get<double>();
}

bool Config::get_bool(const std::string& key) const {
  const KeySpec* spec;
  const json& v = lookup(origin_of(key), find(key), key, &spec);
  if (!v.is_boolean()) throw Error(origin_of(key) + ": " + key + ": expected a boolean, got " + render(v));
  return v.get<bool>();
}

std::string Config::get_string(const std::string& key) const {
  const KeySpec* spec;
  const json& v = lookup(origin_of(key), find(key), key, &spec);
  if (!v.is_string()) throw Error(origin_of(key) + ": " + key + ": expected a string, got " + render(v));
  return v.get<std::string>();
}

std::vector<std::string> Config::get_string_array(const std::string& key) const {
  const KeySpec* spec;
  return array_value<std::string>(origin_of(key), key, lookup(origin_of(key), find(key), key, &spec), Type::StringArray);
}

std::vector<int64_t> Config::get_int_array(const std::string& key) const {
  const KeySpec* spec;
  return array_value<int64_t>(origin_of(key), key, lookup(origin_of(key), find(key), key, &spec), Type::IntArray);
}

bool Config::has(const std::string& key) const { return find(key) != nullptr; }

std::string Config::origin_of(const std::string& key) const {
  auto it = set_by_.find(key);
  return it == set_by_.end() ? origin_ : it->get<std::string>();
}

std::string Config::origin_of_any(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (set_by_.contains(k)) return set_by_.at(k).get<std::string>();
  return origin_;
}

nlohmann::json Config::plugin_tables() const {
  json out = json::object();
  for (const auto& [table, value] : values_.items())
    if (!is_core_table(table)) out[table] = value;
  return out;
}

nlohmann::json Config::section_json(const std::string& table) const {
  if (is_free_table(table) || (values_.contains(table) && is_plugin_table_name(table))) {
    auto it = values_.find(table);
    return it == values_.end() ? json::object() : *it;
  }
  if (!is_schema_table(table)) unknown_key(origin_, table);
  json out = json::object();
  const std::string prefix = table + ".";
  for (const auto& s : schema()) {
    std::string key = s.key;
    if (key.compare(0, prefix.size(), prefix) != 0) continue;
    const json* given = find(key);
    out[key.substr(prefix.size())] = given ? *given : s.def;
  }
  return out;
}

nlohmann::json Config::to_json() const {
  json out = json::object();
  for (const char* t : kSchemaTables) out[t] = section_json(t);
  for (const char* t : kFreeTables) out[t] = section_json(t);
  out.update(plugin_tables());
  return out;
}

std::string Config::reference() {
  auto type_name = [](Type t) {
    switch (t) {
      case Type::Int: return "integer";
      case Type::Double: return "number";
      case Type::Bool: return "boolean";
      case Type::String: return "string";
      case Type::StringArray: return "array of strings";
      case Type::IntArray: return "array of integers";
      case Type::AxisSizes: return "table of integers";
      case Type::AxisJoins: return "table of arrays of strings";
    }
    return "?";
  };
  std::string out =
      "# Job configuration keys\n\n"
      "Generated from the key lists in core/include/smp/config_keys.h by `smp-worker --config-reference`;\n"
      "a test fails when this file differs from it. Tables the core does not check (their owners do):\n"
      "[model] (the adapter), [partition] (the partition strategy), [optimizer] (the optimizer kind),\n"
      "and the tables loaded plugins declare (SMP_EXTENSION_CONFIG), such as smp_tp's [tp]\n"
      "(`sequence_parallel`, boolean, default false: Megatron's sequence parallelism in tensor-parallel\n"
      "layers). A table no loaded plugin declares is refused by name.\n";
  for (const char* table : kSchemaTables) {
    out += "\n## [" + std::string(table) + "]\n\n| key | type | default | accepted | meaning |\n|---|---|---|---|---|\n";
    for (const KeySpec& k : schema()) {
      if (head_of(k.key) != table) continue;
      std::string accepted = k.rule == Rule::None ? "" : expectation(k.type, k.rule);
      if (accepted.rfind("expected ", 0) == 0) accepted = accepted.substr(9);
      std::string def = k.def.is_null() ? "(none)" : k.def.dump();
      for (auto* field : {&accepted, &def})
        for (size_t i = 0; (i = field->find('|', i)) != std::string::npos; i += 2) field->replace(i, 1, "\\|");
      out += "| `" + std::string(k.key) + "` | " + type_name(k.type) + " | `" + def + "` | " + accepted + " | " +
             k.doc + " |\n";
    }
  }
  return out;
}

namespace {

// The placement with every axis of parallel.axes in it (those it does not name
// go just outside tp); throws for a name that is not a dimension.
std::string full_placement(const std::string& origin, const std::string& placement, const json& axes) {
  std::vector<std::string> parts = split_names(placement);
  for (const auto& name : parts)
    if (!in_every_mesh(name) && !axes.contains(name))
      throw Error(origin + ": parallel.placement names \"" + name +
                  "\", which is neither pp, dp, tp, cp (with parallel.cp > 1) nor an axis of parallel.axes");
  for (const auto& [name, size] : axes.items())
    if (std::find(parts.begin(), parts.end(), name) == parts.end())
      parts.insert(std::find(parts.begin(), parts.end(), builtin_dimension(Role::Model)), name);
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

// The product of two mesh sizes (each >= 1), or -1 past int64: the sizes
// are the job file's, and no world is that large.
int64_t size_product(int64_t a, int64_t b) {
  int64_t r = 0;
  return a < 0 || __builtin_mul_overflow(a, b, &r) ? -1 : r;
}
std::string product_text(int64_t p) { return p < 0 ? "more than 2^63" : std::to_string(p); }

void check_flatten(const std::string& origin, const json& flatten, const json& axes) {
  for (const auto& [name, dims] : flatten.items()) {
    if (axes.contains(name))
      throw Error(origin + ": parallel.flatten." + name + ": \"" + name + "\" is already an axis of parallel.axes");
    for (const auto& d : dims) {
      const std::string dim = d.get<std::string>();
      if (!in_every_mesh(dim) && !axes.contains(dim))
        throw Error(origin + ": parallel.flatten." + name + ": \"" + dim +
                    "\" is not a dimension (pp, dp, tp or an axis of parallel.axes)");
      if (std::count(dims.begin(), dims.end(), d) > 1)
        throw Error(origin + ": parallel.flatten." + name + ": names \"" + dim + "\" twice");
    }
  }
}

}  // namespace

void Config::resolve_layout(int world_size) {
  if (world_size < 1) throw Error(origin_ + ": invalid world size " + std::to_string(world_size));
  // The planner lives in the launcher (smp-plan), not in the core.
  if (get_string("parallel.layout") == "auto")
    throw Error(origin_of("parallel.layout") + ": parallel.layout = \"auto\" is resolved by smp-launch, which runs "
                "smp-plan for parallel.cluster and starts the job on the layout it predicts fastest; this process was "
                "started without it: start the job with smp-launch, or set the layout (smp-plan --config prints its "
                "--set lines)");
  const int64_t pp = get_int("parallel.pp"), tp = get_int("parallel.tp");
  const json parallel = section_json("parallel");
  // The job's dimensions beyond pp, dp and tp: parallel.axes, and the built-in
  // sequence axis (cp) when it splits.
  json axes = parallel["axes"];
  for (const BuiltinAxis& b : builtin_axes()) {
    if (b.in_every_mesh || !is_dimension(b.role)) continue;
    const std::string name = b.name;
    if (parallel["axes"].contains(name))
      throw Error(origin_of("parallel.axes") + ": parallel.axes." + name + ": \"" + name + "\" is the " +
                  to_string(b.role) + " axis, set by parallel." + name + " (an axis of parallel.axes splits the "
                  "model and replicates the batch, unless parallel.sequence_axes names it)");
    if (const int64_t size = get_int("parallel." + name); size > 1) axes[name] = size;
  }
  for (const auto& name : parallel["sequence_axes"])
    if (!parallel["axes"].contains(name.get<std::string>()))
      throw Error(origin_of_any({"parallel.sequence_axes", "parallel.axes"}) + ": parallel.sequence_axes names \"" +
                  name.get<std::string>() + "\", which is not an axis of parallel.axes (declare its size there)");
  values_["parallel"]["placement"] =
      full_placement(origin_of_any({"parallel.placement", "parallel.axes"}), parallel["placement"].get<std::string>(), axes);
  check_flatten(origin_of_any({"parallel.flatten", "parallel.axes"}), parallel["flatten"], axes);
  const std::string mesh_origin =
      origin_of_any({"parallel.pp", "parallel.tp", "parallel.dp", "parallel.cp", "parallel.axes"});
  // Every dimension beside pp and dp: tp, the job's own axes and cp.
  int64_t model = tp;
  std::string model_names = "parallel.tp", model_sizes = std::to_string(tp);
  for (const auto& [name, size] : axes.items()) {
    model = size_product(model, size.get<int64_t>());
    model_names += builtin_axis(name) ? " * parallel." + name : " * parallel.axes." + name;
    model_sizes += " * " + std::to_string(size.get<int64_t>());
  }
  const json* dpv = find("parallel.dp");
  int64_t dp;
  if (dpv) {
    dp = dpv->get<int64_t>();
    const int64_t mesh = size_product(size_product(pp, model), dp);
    if (mesh != world_size)
      throw Error(mesh_origin + ": parallel.pp * " + model_names + " * parallel.dp = " + std::to_string(pp) + " * " +
                  model_sizes + " * " + std::to_string(dp) + " = " + product_text(mesh) +
                  ", but the world size is " + std::to_string(world_size));
  } else {
    const int64_t pp_model = size_product(pp, model);
    if (pp_model < 0 || world_size % pp_model != 0)
      throw Error(mesh_origin + ": parallel.pp * " + model_names + " = " + std::to_string(pp) + " * " + model_sizes +
                  " = " + product_text(pp_model) + " does not divide the world size " +
                  std::to_string(world_size) + " (parallel.dp is derived as world / (pp * tp" +
                  (axes.empty() ? "" : " * the axes") + "))");
    dp = world_size / pp_model;
    values_["parallel"]["dp"] = dp;
  }
  const int64_t ep = get_int("parallel.ep");
  if (dp % ep != 0)
    throw Error(origin_of_any({"parallel.ep", "parallel.dp"}) + ": parallel.ep = " + std::to_string(ep) + " must divide parallel.dp = " +
                std::to_string(dp) + " (expert parallelism splits the data-parallel ranks)");
  const int64_t mb = get_int("parallel.microbatches");
  if (mb > pipeline_limits::kMicrobatches)
    throw Error(origin_of("parallel.microbatches") + ": parallel.microbatches = " + std::to_string(mb) + ": at most " +
                std::to_string(pipeline_limits::kMicrobatches) +
                " (a pipeline message's tag tells microbatches apart in 12 bits; accumulate over steps instead)");
  const int64_t batch = get_int("train.batch_size");
  if (batch % (dp * mb) != 0)
    throw Error(origin_of_any({"train.batch_size", "parallel.dp", "parallel.microbatches"}) + ": train.batch_size = " + std::to_string(batch) +
                " is not divisible by parallel.dp * parallel.microbatches = " + std::to_string(dp) + " * " +
                std::to_string(mb) + " = " + std::to_string(dp * mb));
  const std::string schedule = get_string("parallel.schedule");
  const int64_t vs = get_int("parallel.virtual_stages");
  if (vs > pipeline_limits::kChunks)
    throw Error(origin_of("parallel.virtual_stages") + ": parallel.virtual_stages = " + std::to_string(vs) +
                ": at most " + std::to_string(pipeline_limits::kChunks) +
                " (a pipeline message's tag tells a rank's virtual stages apart in 4 bits)");
  if (vs > 1 && schedule != "interleaved-1f1b")
    throw Error(origin_of_any({"parallel.virtual_stages", "parallel.schedule"}) + ": parallel.virtual_stages = " + std::to_string(vs) +
                " needs parallel.schedule = \"interleaved-1f1b\", got \"" + schedule + "\"");
  if (schedule == "interleaved-1f1b" && mb % pp != 0)
    throw Error(origin_of_any({"parallel.schedule", "parallel.microbatches", "parallel.pp"}) +
                ": parallel.schedule = \"interleaved-1f1b\" needs parallel.microbatches (" +
                std::to_string(mb) + ") to be a multiple of parallel.pp (" + std::to_string(pp) + ")");
}

}  // namespace smp
