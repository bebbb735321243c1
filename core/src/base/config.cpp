// Config: TOML (toml++) + --set overrides, validated against the schema below.
#include <smp/config.h>
#include <smp/error.h>

#include "base/axis_names.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace smp {
namespace {

using nlohmann::json;

// AxisSizes: a table of axis name -> size; AxisJoins: axis name -> dimension names.
enum class Type { Int, Double, Bool, String, StringArray, IntArray, AxisSizes, AxisJoins };

// What a value must satisfy beyond its type.
enum class Rule { None, Positive, NonNegative, PositiveReal, NonNegativeReal, UnitInterval,
                  Schedule, Placement, Device, Precision, CudaBackend, ZeroStage, ShardName };

struct KeySpec {
  const char* key;
  Type type;
  json def;  // null = optional without default (parallel.dp)
  Rule rule;
  const char* doc;  // one line for the key reference (docs/config-reference.md, generated)
};

// The schema: every key a job file may set outside the free-form tables, each
// declared once. The reference in docs/ is rendered from it (Config::reference).
const std::vector<KeySpec>& schema() {
  static const std::vector<KeySpec> s = {
      {"parallel.pp", Type::Int, 1, Rule::Positive, "pipeline-parallel degree (stages)"},
      {"parallel.tp", Type::Int, 1, Rule::Positive, "tensor-parallel degree"},
      {"parallel.dp", Type::Int, nullptr, Rule::Positive,
       "data-parallel degree; default world / (pp x tp), and pp x tp x dp must be the world"},
      {"parallel.ep", Type::Int, 1, Rule::Positive,
       "expert parallelism: the dp ranks of a (pp, tp) slice split into groups of ep that exchange tokens; "
       "expert parameters are data-parallel over the other dp / ep ranks (edp)"},
      {"parallel.microbatches", Type::Int, 1, Rule::Positive, "microbatches per step and data-parallel rank"},
      {"parallel.schedule", Type::String, "1f1b", Rule::Schedule, "pipeline schedule"},
      {"parallel.virtual_stages", Type::Int, 1, Rule::Positive,
       "model chunks per pipeline rank (interleaved-1f1b only)"},
      {"parallel.partition", Type::String, "balanced", Rule::None,
       "partition strategy of a loaded plugin (smp_partition: balanced, tree, manual); its options in [partition]"},
      {"parallel.placement", Type::String, "pp,dp,tp", Rule::Placement,
       "rank order of the mesh dimensions, slowest- to fastest-varying; an axis of parallel.axes it does not name "
       "goes just outside tp"},
      {"parallel.axes", Type::AxisSizes, json::object(), Rule::None,
       "the job's own mesh dimensions beyond pp, dp and tp, e.g. { cp = 2 }: model axes that replicate the batch "
       "and split what the loaded plugins' rules for them split (in name order, after tp's)"},
      {"parallel.flatten", Type::AxisJoins, json::object(), Rule::None,
       "derived axes joining dimensions, slowest first, e.g. { dp_cp = [\"dp\", \"cp\"] }: each has a communicator "
       "a plugin can ask for"},
      {"parallel.sequence_parallel", Type::Bool, false, Rule::None,
       "Megatron's sequence parallelism in tensor-parallel layers"},
      {"parallel.tie_across_stages", Type::Bool, true, Rule::None,
       "tied modules may sit on several pipeline stages (their gradients are summed over them)"},
      {"parallel.tp_replicate_indivisible", Type::Bool, false, Rule::None,
       "keep a node replicated (with a warning) when its sizes do not divide tp, instead of failing"},
      {"parallel.zero", Type::Int, 0, Rule::ZeroStage,
       "sharded data parallelism (ZeRO): 0 none, 1 optimizer state, 2 + gradients, 3 + parameters"},

      {"memory.shard", Type::String, nullptr, Rule::ShardName,
       "the ZeRO stage by name; give it or parallel.zero (both only if they agree)"},
      {"memory.checkpoint", Type::StringArray, json::array(), Rule::None,
       "activation checkpointing: nodes whose kind, name or name prefix is listed recompute their activations "
       "in backward"},
      {"memory.checkpoint_every", Type::Int, 1, Rule::Positive, "of the nodes memory.checkpoint selects, every n-th"},
      {"memory.checkpoint_attention_core", Type::StringArray, json::array(), Rule::None,
       "selective checkpointing: the listed nodes recompute their attention core (softmax(Q K^T) V) in backward"},
      {"memory.offload", Type::Bool, false, Rule::None,
       "CUDA only: the inputs checkpointed nodes keep for backward wait in pinned host memory"},
      {"memory.offload_horizon", Type::Int, 4, Rule::Positive,
       "offloaded inputs are loaded back this many backward passes ahead"},

      {"train.steps", Type::Int, 10, Rule::NonNegative, "training steps"},
      {"train.batch_size", Type::Int, 8, Rule::Positive,
       "global batch (samples per step); a multiple of dp x microbatches"},
      {"train.seed", Type::Int, 1234, Rule::None, "seeds initialisation, data order and dropout (counter-based)"},
      {"train.lr", Type::Double, 3e-4, Rule::NonNegativeReal, "peak learning rate"},
      {"train.min_lr", Type::Double, 3e-5, Rule::NonNegativeReal, "learning rate at the end of the cosine decay"},
      {"train.warmup_steps", Type::Int, 0, Rule::NonNegative, "linear warm-up steps before the cosine decay"},
      {"train.optimizer", Type::String, "adamw", Rule::None,
       "an optimizer kind of a loaded plugin (smp_optim: adamw, sgd); its own settings in [optimizer]"},
      {"train.weight_decay", Type::Double, 0.1, Rule::NonNegativeReal, "decoupled weight decay, on matrices"},
      {"train.beta1", Type::Double, 0.9, Rule::UnitInterval, "AdamW's beta1 (refused with another optimizer)"},
      {"train.beta2", Type::Double, 0.95, Rule::UnitInterval, "AdamW's beta2 (refused with another optimizer)"},
      {"train.eps", Type::Double, 1e-8, Rule::PositiveReal, "AdamW's epsilon (refused with another optimizer)"},
      {"train.grad_clip", Type::Double, 1.0, Rule::NonNegativeReal, "global gradient-norm clipping; 0 = off"},
      {"train.val_every", Type::Int, 0, Rule::NonNegative, "validate every n steps (and at the end); 0 = at the end"},
      {"train.val_batches", Type::Int, 2, Rule::NonNegative, "global batches per validation; 0 = no validation"},
      {"train.log_every", Type::Int, 1, Rule::Positive, "a progress line every n steps (rank 0)"},
      {"train.bucket_mb", Type::Double, 4.0, Rule::NonNegativeReal,
       "DDP-style gradient buckets (MiB) reduced while backward runs; 0 = one reduction after backward"},
      {"train.precision", Type::String, "fp32", Rule::Precision,
       "compute dtype of parameters and activations; 16-bit keeps fp32 masters and optimizer state"},
      {"train.grad_reduce_dtype", Type::String, "fp32", Rule::Precision,
       "dtype gradients are accumulated and reduced in: fp32 or the compute dtype"},
      {"train.initial_loss_scale", Type::Double, 65536.0, Rule::PositiveReal,
       "fp16 only: the dynamic loss scale to start with"},
      {"train.loss_scale_window", Type::Int, 1000, Rule::Positive,
       "fp16 only: good steps in a row before the loss scale doubles"},
      {"train.min_loss_scale", Type::Double, 1.0, Rule::PositiveReal, "fp16 only: the loss scale never goes below"},

      {"run.dir", Type::String, "runs/default", Rule::None, "where logs, summary.json, report.html and traces go"},
      {"run.log_to_file", Type::Bool, true, Rule::None, "each rank also logs to <run.dir>/logs/rank-<r>.log"},
      {"run.timeout_s", Type::Double, 300.0, Rule::PositiveReal,
       "rendezvous and collective timeout; a rank waiting longer fails naming the group"},
      {"run.threads", Type::Int, 0, Rule::NonNegative, "intra-op threads per rank; 0 = OMP_NUM_THREADS or LibTorch's"},
      {"run.device", Type::String, "auto", Rule::Device, "auto = CUDA when this build has it and a GPU is present"},
      {"run.devices", Type::IntArray, json::array(), Rule::None,
       "with run.device = cuda: the GPU of each local rank (entries may repeat: ranks sharing a GPU)"},
      {"run.dump_parameters", Type::Bool, false, Rule::None,
       "each rank writes its parameter shards to <run.dir>/parameters/rank-<r>.json (small models)"},
      {"run.trace", Type::Bool, false, Rule::None,
       "each rank writes a Chrome / Perfetto trace of the run.trace_steps steps to <run.dir>/trace/"},
      {"run.trace_steps", Type::IntArray, json::array({1, 3}), Rule::None,
       "[from, to], training steps (1-based, inclusive) that run.trace and run.profile_ops record"},
      {"run.trace_merge", Type::Bool, false, Rule::None, "rank 0 also writes <run.dir>/trace.json, a track per rank"},
      {"run.profile_ops", Type::Bool, false, Rule::None,
       "every ATen op and autograd node of the traced steps by name, to <run.dir>/ops/rank-<r>.json"},

      {"comm.shm_mb", Type::Double, 16.0, Rule::NonNegativeReal,
       "CPU collectives and pipeline sends through shared memory on one host, slots of this many MiB; 0 = Gloo"},
      {"comm.cuda_backend", Type::String, "auto", Rule::CudaBackend,
       "what carries CUDA tensors: nccl, gloo (through host memory), or auto (NCCL unless ranks share a GPU)"},

      {"plugins.paths", Type::StringArray, json::array(), Rule::None,
       "plugins to load besides --plugin (by path or name, searched in SMP_PLUGIN_PATH and the install)"},
  };
  return s;
}

const char* kSchemaTables[] = {"parallel", "memory", "train", "run", "comm", "plugins"};
const char* kFreeTables[] = {"model", "partition", "optimizer"};

bool is_schema_table(const std::string& t) {
  return std::find(std::begin(kSchemaTables), std::end(kSchemaTables), t) != std::end(kSchemaTables);
}
bool is_free_table(const std::string& t) {
  return std::find(std::begin(kFreeTables), std::end(kFreeTables), t) != std::end(kFreeTables);
}

const KeySpec* find_spec(const std::string& key) {
  for (const auto& s : schema())
    if (key == s.key) return &s;
  return nullptr;
}

std::string head_of(const std::string& key) { return key.substr(0, key.find('.')); }

// Levenshtein distance, for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

[[noreturn]] void unknown_key(const std::string& origin, const std::string& key) {
  std::string msg = origin + ": unknown key '" + key + "'";
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
    msg += " (expected one of the tables [parallel], [train], [run], [plugins], [model], [partition], [optimizer])";
  throw Error(msg);
}

// A value rendered for messages: strings in double quotes, tables as "a table".
std::string render(const json& j) {
  if (j.is_object()) return "a table";
  return j.dump();
}
json to_json_value(const toml::node& n);
std::string render(const toml::node& n) { return render(to_json_value(n)); }

const char* expectation(Type t, Rule r) {
  switch (r) {
    case Rule::Positive: return "expected a positive integer";
    case Rule::NonNegative: return "expected a non-negative integer";
    case Rule::PositiveReal: return "expected a number > 0";
    case Rule::NonNegativeReal: return "expected a number >= 0";
    case Rule::UnitInterval: return "expected a number in [0, 1)";
    case Rule::Schedule:
      return "expected one of \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"zb-h1\" "
             "(or the aliases \"simple\", \"interleaved\")";
    case Rule::Placement:
      return "expected a permutation of \"pp,dp,tp\" and any axes of parallel.axes (slowest- to fastest-varying), "
             "or \"cluster\"/\"spread\"";
    case Rule::Device: return "expected one of \"auto\", \"cpu\", \"cuda\"";
    case Rule::Precision: return "expected one of \"fp32\", \"bf16\", \"fp16\"";
    case Rule::CudaBackend: return "expected one of \"auto\", \"nccl\", \"gloo\"";
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

// Placement "cluster"/"spread"/"pp, dp, tp" -> "pp,dp,tp"; "" when invalid.
// Names beyond pp, dp and tp are checked against parallel.axes by resolve_layout.
std::string normalise_placement(const std::string& s) {
  if (s == "cluster") return "pp,dp,tp";
  if (s == "spread") return "pp,tp,dp";
  const std::vector<std::string> parts = split_names(s);
  std::string out;
  for (const auto& p : parts) {
    if (!is_axis_name(p) || std::count(parts.begin(), parts.end(), p) > 1) return "";
    if (is_core_axis(p) && p != "pp" && p != "dp" && p != "tp") return "";
    out += (out.empty() ? "" : ",") + p;
  }
  for (const char* core : {"pp", "dp", "tp"})
    if (std::find(parts.begin(), parts.end(), core) == parts.end()) return "";
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

// Checks one schema value; returns it normalised. Throws naming origin and key.
json check_value(const std::string& origin, const KeySpec& spec, const toml::node& n) {
  auto fail = [&]() -> json {
    throw Error(origin + ": " + spec.key + ": " + expectation(spec.type, spec.rule) + ", got " + render(n));
  };
  json v;
  switch (spec.type) {
    case Type::Int:
      if (!n.is_integer()) return fail();
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
        if (!is_axis_name(name) || is_core_axis(name)) return fail();
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
  switch (spec.rule) {
    case Rule::None: break;
    case Rule::Positive:
      if (v.get<int64_t>() < 1) return fail();
      break;
    case Rule::NonNegative:
      if (v.get<int64_t>() < 0) return fail();
      break;
    case Rule::PositiveReal:
      if (!(v.get<double>() > 0)) return fail();
      break;
    case Rule::NonNegativeReal:
      if (!(v.get<double>() >= 0)) return fail();
      break;
    case Rule::UnitInterval:
      if (!(v.get<double>() >= 0 && v.get<double>() < 1)) return fail();
      break;
    case Rule::Schedule: {
      std::string s = normalise_schedule(v.get<std::string>());
      if (s.empty()) return fail();
      v = s;
      break;
    }
    case Rule::Placement: {
      std::string s = normalise_placement(v.get<std::string>());
      if (s.empty()) return fail();
      v = s;
      break;
    }
    case Rule::Device: {
      const auto& s = v.get_ref<const std::string&>();
      if (s != "auto" && s != "cpu" && s != "cuda") return fail();
      break;
    }
    case Rule::Precision: {
      const auto& s = v.get_ref<const std::string&>();
      if (s != "fp32" && s != "bf16" && s != "fp16") return fail();
      break;
    }
    case Rule::CudaBackend: {
      const auto& s = v.get_ref<const std::string&>();
      if (s != "auto" && s != "nccl" && s != "gloo") return fail();
      break;
    }
    case Rule::ZeroStage:
      if (v.get<int64_t>() < 0 || v.get<int64_t>() > 3) return fail();
      break;
    case Rule::ShardName: {
      const auto& s = v.get_ref<const std::string&>();
      if (s != "none" && s != "optimizer" && s != "gradients" && s != "parameters") return fail();
      break;
    }
  }
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
    if (!is_schema_table(table)) unknown_key(origin, table);
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

// One --set "a.b=value".
void apply_override(const std::string& arg, json& values) {
  const std::string origin = "--set " + arg;
  auto eq = arg.find('=');
  if (eq == std::string::npos)
    throw Error(origin + ": malformed override, expected key=value (e.g. --set train.steps=5)");
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
  if (parts.size() < 2) {
    if (is_free_table(table) || is_schema_table(table))
      throw Error(origin + ": '" + key + "' is a table; set one of its keys, e.g. --set " + table + ".<key>=value");
    unknown_key(origin, key);
  }
  if (is_free_table(table)) {
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
  // One entry of a table-valued key: --set parallel.axes.cp=2.
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

void build(const std::string& origin, const toml::table& doc, const std::vector<std::string>& overrides,
           json& values) {
  merge_document(origin, doc, values);
  for (const auto& o : overrides) apply_override(o, values);
}

}  // namespace

Config Config::load(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open the config file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return from_string(ss.str(), path, overrides);
}

Config Config::from_string(const std::string& text, const std::string& origin_name,
                           const std::vector<std::string>& overrides) {
  toml::table doc;
  try {
    doc = toml::parse(text, origin_name);
  } catch (const toml::parse_error& e) {
    throw Error(describe_parse_error(origin_name, e));
  }
  Config c;
  c.origin_ = origin_name;
  build(origin_name, doc, overrides, c.values_);
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
  const json& v = lookup(origin_, find(key), key, &spec);
  if (!v.is_number_integer()) throw Error(origin_ + ": " + key + ": expected an integer, got " + render(v));
  return v.get<int64_t>();
}

double Config::get_double(const std::string& key) const {
  const KeySpec* spec;
  const json& v = lookup(origin_, find(key), key, &spec);
  if (!v.is_number()) throw Error(origin_ + ": " + key + ": expected a number, got " + render(v));
  return v.get<double>();
}

bool Config::get_bool(const std::string& key) const {
  const KeySpec* spec;
  const json& v = lookup(origin_, find(key), key, &spec);
  if (!v.is_boolean()) throw Error(origin_ + ": " + key + ": expected a boolean, got " + render(v));
  return v.get<bool>();
}

std::string Config::get_string(const std::string& key) const {
  const KeySpec* spec;
  const json& v = lookup(origin_, find(key), key, &spec);
  if (!v.is_string()) throw Error(origin_ + ": " + key + ": expected a string, got " + render(v));
  return v.get<std::string>();
}

std::vector<std::string> Config::get_string_array(const std::string& key) const {
  const KeySpec* spec;
  return array_value<std::string>(origin_, key, lookup(origin_, find(key), key, &spec), Type::StringArray);
}

std::vector<int64_t> Config::get_int_array(const std::string& key) const {
  const KeySpec* spec;
  return array_value<int64_t>(origin_, key, lookup(origin_, find(key), key, &spec), Type::IntArray);
}

bool Config::has(const std::string& key) const { return find(key) != nullptr; }

nlohmann::json Config::section_json(const std::string& table) const {
  if (is_free_table(table)) {
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
      "Generated from the schema in core/src/base/config.cpp by `smp-worker --config-reference`;\n"
      "a test fails when this file differs from it. Tables the core does not check (their owners do):\n"
      "[model] (the adapter), [partition] (the partition strategy), [optimizer] (the optimizer kind).\n";
  std::string table;
  for (const KeySpec& k : schema()) {
    const std::string head = head_of(k.key);
    if (head != table) {
      table = head;
      out += "\n## [" + table + "]\n\n| key | type | default | accepted | meaning |\n|---|---|---|---|---|\n";
    }
    std::string accepted = k.rule == Rule::None ? "" : expectation(k.type, k.rule);
    if (accepted.rfind("expected ", 0) == 0) accepted = accepted.substr(9);
    std::string def = k.def.is_null() ? "(none)" : k.def.dump();
    for (auto* field : {&accepted, &def})
      for (size_t i = 0; (i = field->find('|', i)) != std::string::npos; i += 2) field->replace(i, 1, "\\|");
    out += "| `" + std::string(k.key) + "` | " + type_name(k.type) + " | `" + def + "` | " + accepted + " | " + k.doc +
           " |\n";
  }
  return out;
}

namespace {

// The placement with every axis of parallel.axes in it (those it does not name
// go just outside tp); throws for a name that is not a dimension.
std::string full_placement(const std::string& origin, const std::string& placement, const json& axes) {
  std::vector<std::string> parts = split_names(placement);
  for (const auto& name : parts)
    if (name != "pp" && name != "dp" && name != "tp" && !axes.contains(name))
      throw Error(origin + ": parallel.placement names \"" + name +
                  "\", which is neither pp, dp, tp nor an axis of parallel.axes");
  for (const auto& [name, size] : axes.items())
    if (std::find(parts.begin(), parts.end(), name) == parts.end())
      parts.insert(std::find(parts.begin(), parts.end(), "tp"), name);
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

void check_flatten(const std::string& origin, const json& flatten, const json& axes) {
  for (const auto& [name, dims] : flatten.items()) {
    if (axes.contains(name))
      throw Error(origin + ": parallel.flatten." + name + ": \"" + name + "\" is already an axis of parallel.axes");
    for (const auto& d : dims) {
      const std::string dim = d.get<std::string>();
      if (dim != "pp" && dim != "dp" && dim != "tp" && !axes.contains(dim))
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
  const int64_t pp = get_int("parallel.pp"), tp = get_int("parallel.tp");
  const json parallel = section_json("parallel");
  const json& axes = parallel["axes"];
  values_["parallel"]["placement"] = full_placement(origin_, parallel["placement"].get<std::string>(), axes);
  check_flatten(origin_, parallel["flatten"], axes);
  // The model dimensions: tp and the job's own axes.
  int64_t model = tp;
  std::string model_names = "parallel.tp", model_sizes = std::to_string(tp);
  for (const auto& [name, size] : axes.items()) {
    model *= size.get<int64_t>();
    model_names += " * parallel.axes." + name;
    model_sizes += " * " + std::to_string(size.get<int64_t>());
  }
  const json* dpv = find("parallel.dp");
  int64_t dp;
  if (dpv) {
    dp = dpv->get<int64_t>();
    if (pp * model * dp != world_size)
      throw Error(origin_ + ": parallel.pp * " + model_names + " * parallel.dp = " + std::to_string(pp) + " * " +
                  model_sizes + " * " + std::to_string(dp) + " = " + std::to_string(pp * model * dp) +
                  ", but the world size is " + std::to_string(world_size));
  } else {
    if (world_size % (pp * model) != 0)
      throw Error(origin_ + ": parallel.pp * " + model_names + " = " + std::to_string(pp) + " * " + model_sizes +
                  " = " + std::to_string(pp * model) + " does not divide the world size " +
                  std::to_string(world_size) + " (parallel.dp is derived as world / (pp * tp" +
                  (axes.empty() ? "" : " * the axes") + "))");
    dp = world_size / (pp * model);
    values_["parallel"]["dp"] = dp;
  }
  const int64_t ep = get_int("parallel.ep");
  if (dp % ep != 0)
    throw Error(origin_ + ": parallel.ep = " + std::to_string(ep) + " must divide parallel.dp = " +
                std::to_string(dp) + " (expert parallelism splits the data-parallel ranks)");
  const int64_t mb = get_int("parallel.microbatches");
  const int64_t batch = get_int("train.batch_size");
  if (batch % (dp * mb) != 0)
    throw Error(origin_ + ": train.batch_size = " + std::to_string(batch) +
                " is not divisible by parallel.dp * parallel.microbatches = " + std::to_string(dp) + " * " +
                std::to_string(mb) + " = " + std::to_string(dp * mb));
  const std::string schedule = get_string("parallel.schedule");
  const int64_t vs = get_int("parallel.virtual_stages");
  if (vs > 1 && schedule != "interleaved-1f1b")
    throw Error(origin_ + ": parallel.virtual_stages = " + std::to_string(vs) +
                " needs parallel.schedule = \"interleaved-1f1b\", got \"" + schedule + "\"");
  if (schedule == "interleaved-1f1b" && mb % pp != 0)
    throw Error(origin_ + ": parallel.schedule = \"interleaved-1f1b\" needs parallel.microbatches (" +
                std::to_string(mb) + ") to be a multiple of parallel.pp (" + std::to_string(pp) + ")");
}

}  // namespace smp
