#include <smp/plugin_registry.h>
#include "plugin/plugin_tables.h"

#include "base/axis_names.h"
#include "plugin/struct_size.h"
#include "base/table_names.h"

#include <smp/error.h>

#include "plugin/elf_check.h"
#include "plugin/host_api.h"

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <boost/filesystem.hpp>
#include <spdlog/spdlog.h>

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

namespace smp {

namespace fs = boost::filesystem;

struct PluginRegistry::Library {
  boost::dll::shared_library lib;
  std::string path;
};

PluginRegistry::PluginRegistry() = default;
// Modules created from a plugin must be destroyed before this runs (the Runtime
// owns both and destroys modules first).
PluginRegistry::~PluginRegistry() = default;

namespace {

std::string versions(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// The file this code is in: libsmp_core, or the program linking the core
// statically. dladdr, which this_line_location reads, names the main program
// by its argv[0]: a bare name when it was started through PATH (smp-plan
// --config then found no plugins). The kernel's /proc/self/exe
// (program_location) names it wherever it was started from, as smp-launch
// finds smp-worker (default_worker_path).
fs::path core_location() {
  fs::path self = boost::dll::this_line_location();
  if (self.is_relative()) {
    boost::dll::fs::error_code ec;
    const fs::path program = boost::dll::program_location(ec);
    boost::system::error_code eq;
    if (!ec && (!fs::exists(self, eq) || fs::equivalent(self, program, eq))) self = program;
    else self = fs::absolute(self);
  }
  return self;
}

// The install's plugin folder, relative to libsmp_core itself, so the build tree
// and an installed tree both work without configuration.
// A program that links the core statically (this tree's tests and tools) sits
// in <prefix>/bin: the plugins are then under <prefix>/<libdir>.
std::string builtin_plugin_dir() {
  fs::path here = core_location().parent_path();  // <prefix>/lib, or <prefix>/bin
  fs::path dir = here / "smp" / "plugins";
  if (!fs::exists(dir) && fs::exists(here.parent_path() / SMP_PLUGIN_SUBDIR)) dir = here.parent_path() / SMP_PLUGIN_SUBDIR;
  return dir.string();
}

// What a plugin fills: at least the fields of `since` (the minor that added the struct).
template <class T>
void require_size(const T* s, size_t needed, const std::string& what, const std::string& file,
                  const char* since = "2.0") {
  require_struct_size(s, needed, since, "plugin " + file + ": " + what);
}

}  // namespace

std::vector<std::string> PluginRegistry::search_path() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("SMP_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string d;
    while (std::getline(ss, d, ':'))
      if (!d.empty()) dirs.push_back(d);
  }
  dirs.push_back(builtin_plugin_dir());
  return dirs;
}

std::string PluginRegistry::resolve(const std::string& name) {
  if (name.find('/') != std::string::npos) {
    if (!fs::exists(name)) throw Error("plugin " + name + ": no such file");
    return fs::canonical(name).string();
  }
  std::vector<std::string> candidates{name};
  if (fs::path(name).extension() != ".so") candidates.push_back(name + ".so");
  std::string searched;
  for (const auto& dir : search_path()) {
    for (const auto& c : candidates) {
      fs::path p = fs::path(dir) / c;
      if (fs::exists(p)) return fs::canonical(p).string();
    }
    searched += (searched.empty() ? "" : ", ") + dir;
  }
  throw Error("plugin '" + name + "' not found in SMP_PLUGIN_PATH or the install (searched: " + searched + ")");
}

const PluginInfo& PluginRegistry::load(const std::string& path_or_name) {
  return *load(path_or_name, false);
}

const PluginInfo* PluginRegistry::load_unless_provided(const std::string& path_or_name) {
  return load(path_or_name, true);
}

namespace {

// Calls a plugin's entry point (a library's exported symbol, or a program's
// in-process entry); the descriptor is the plugin's, its version prefix checked.
const smp_plugin_descriptor* call_entry(const PluginEntry& entry, const std::string& path) {
  smp_error* err = nullptr;
  const smp_plugin_descriptor* d = nullptr;
  try {
    d = entry(host_api(), &err);
  } catch (...) {
    throw Error("plugin " + path + ": entry point threw a C++ exception across the ABI");
  }
  const std::string core_abi = versions(SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR);
  if (!d) {
    std::string why = err ? consume_error(err) : "no reason given (it may have been built for another ABI major)";
    throw Error("plugin " + path + ": refused to load into smp ABI " + core_abi + ": " + why);
  }
  consume_error(err);
  // struct_size first: it tells which fields we may read.
  if (d->struct_size < SMP_PLUGIN_DESCRIPTOR_VERSION_PREFIX)
    throw Error("plugin " + path + ": descriptor struct_size " + std::to_string(d->struct_size) +
                " is too small to hold a version (core has ABI " + core_abi + ", whose descriptor is " +
                std::to_string(SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE) + " bytes)");
  const std::string plugin_abi = versions(d->abi_major, d->abi_minor);
  // The version prefix (name, plugin_version, abi_major, abi_minor) is the same
  // in every major, so a plugin of another major is refused by name.
  const std::string named = std::string(d->name ? d->name : "?") + " " + (d->plugin_version ? d->plugin_version : "?");
  if (d->abi_major != SMP_ABI_VERSION_MAJOR)
    throw Error("plugin " + path + " ('" + named + "'): built for smp ABI " + plugin_abi + ", core has ABI " +
                core_abi + " (major versions differ: rebuild the plugin against the smp " +
                std::to_string(SMP_ABI_VERSION_MAJOR) + ".x SDK)");
  if (d->abi_minor > SMP_ABI_VERSION_MINOR)
    throw Error("plugin " + path + ": built for smp ABI " + plugin_abi + ", newer than the core's ABI " + core_abi +
                " (rebuild the plugin against this core or upgrade the core)");
  require_size(d, SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE, "descriptor", path);
  return d;
}

// Opens the library and calls its exported entry point (the descriptor is
// valid while the library is loaded).
const smp_plugin_descriptor* enter(boost::dll::shared_library& lib, const std::string& path) {
  // Its headers first: dlopen maps segments as they claim, and a truncated
  // file is SIGBUS inside it (a named pipe would block it).
  plugin::check_elf_file(path);
  try {
    lib.load(path, boost::dll::load_mode::rtld_lazy | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    throw Error("plugin " + path + ": cannot be loaded: " + e.what());
  }
  if (!lib.has(SMP_PLUGIN_ENTRY_SYMBOL))
    throw Error("plugin " + path + ": missing entry symbol '" SMP_PLUGIN_ENTRY_SYMBOL
                "' (is it an smp plugin? build it with smp_add_plugin / SMP_PLUGIN)");
  auto* entry = &lib.get<const smp_plugin_descriptor*(const smp_host_api*, smp_error**)>(SMP_PLUGIN_ENTRY_SYMBOL);
  return call_entry(PluginEntry(entry), path);
}

PluginInfo info_of(const smp_plugin_descriptor* d, const std::string& path) {
  PluginInfo info;
  info.path = path;
  info.name = d->name ? d->name : "";
  info.version = d->plugin_version ? d->plugin_version : "";
  info.abi_major = d->abi_major;
  info.abi_minor = d->abi_minor;
  info.torch_version = d->torch_version ? d->torch_version : "";
  if (info.name.empty()) throw Error("plugin " + path + ": descriptor has no name");
  const std::string core_torch = host_api()->torch_version;
  if (!info.torch_version.empty() && info.torch_version != core_torch)
    throw Error("plugin " + path + " ('" + info.name + "'): built against LibTorch " + info.torch_version +
                ", core uses LibTorch " + core_torch + " (tensors cross as at::Tensor: versions must match)");
  return info;
}

// The descriptor's extension of `type`, or null.
template <class T>
const T* extension_of(const smp_plugin_descriptor* d, uint32_t type) {
  for (const smp_extension_base* e = d->extension_start; e; e = e->next)
    if (e->type == type) return reinterpret_cast<const T*>(e);
  return nullptr;
}
const smp_optimizers_extension* optimizers_of(const smp_plugin_descriptor* d) {  // 2.3
  return extension_of<smp_optimizers_extension>(d, SMP_EXTENSION_OPTIMIZERS);
}
const smp_config_extension* config_of(const smp_plugin_descriptor* d) {  // 2.5
  return extension_of<smp_config_extension>(d, SMP_EXTENSION_CONFIG);
}
const smp_memory_extension* memory_of(const smp_plugin_descriptor* d) {  // 2.5
  return extension_of<smp_memory_extension>(d, SMP_EXTENSION_MEMORY);
}
const smp_inference_extension* inference_of(const smp_plugin_descriptor* d) {  // 2.7
  return extension_of<smp_inference_extension>(d, SMP_EXTENSION_INFERENCE);
}


// Calls f(type, name) for every capability the descriptor lists (null entries skipped).
template <class F>
void for_each_capability(const smp_plugin_descriptor* d, F f) {
  for (size_t i = 0; i < d->n_module_kinds; ++i)
    if (d->module_kinds[i]) f("module kind", d->module_kinds[i]->name);
  for (size_t i = 0; i < d->n_adapters; ++i)
    if (d->adapters[i]) f("adapter", d->adapters[i]->name);
  for (size_t i = 0; i < d->n_partitioners; ++i)
    if (d->partitioners[i]) f("partition strategy", d->partitioners[i]->name);
  for (size_t i = 0; i < d->n_rules; ++i)
    if (d->rules[i] && d->rules[i]->axis) f(std::string(d->rules[i]->axis) + " rule", d->rules[i]->kind);
  if (const smp_optimizers_extension* o = optimizers_of(d))
    for (size_t i = 0; i < o->n_kinds; ++i)
      if (o->kinds && o->kinds[i]) f("optimizer", o->kinds[i]->name);
  if (const smp_config_extension* c = config_of(d))
    for (size_t i = 0; i < c->n_tables; ++i)
      if (c->tables && c->tables[i]) f("config table", c->tables[i]->name);
}

}  // namespace

const PluginInfo* PluginRegistry::load(const std::string& path_or_name, bool unless_provided) {
  const std::string path = resolve(path_or_name);
  for (const auto& info : infos_)
    if (info.path == path) return &info;
  auto library = std::make_unique<Library>();
  library->path = path;
  const smp_plugin_descriptor* d = enter(library->lib, path);
  const PluginInfo* info = admit(d, path, unless_provided);
  if (!info) return nullptr;
  // Pin an accepted library for the life of the process: autograd nodes and
  // tensors created by its code may outlive the registry. (A refused one is
  // unloaded when `library` goes out of scope.)
  dlopen(path.c_str(), RTLD_LAZY | RTLD_LOCAL | RTLD_NODELETE | RTLD_NOLOAD);
  libraries_.push_back(std::move(library));
  return info;
}

const PluginInfo& PluginRegistry::add(const std::string& label, const PluginEntry& entry) {
  if (!entry) throw Error("in-process plugin '" + label + "': no entry function");
  const std::string path = "in process: " + label;
  for (const auto& info : infos_)
    if (info.path == path) throw Error("plugin " + path + ": a plugin of that label is already registered");
  const PluginInfo* info = admit(call_entry(entry, path), path, false);
  entries_.push_back(entry);
  return *info;
}

const PluginInfo& PluginRegistry::load_source(const PluginSource& source) {
  return source.in_process() ? add(source.name, source.entry) : load(source.name);
}

// Checks a descriptor whole, then registers what it provides.
const PluginInfo* PluginRegistry::admit(const smp_plugin_descriptor* d, const std::string& path, bool unless_provided) {
  PluginInfo info = info_of(d, path);
  // Validate everything before registering anything, so a refusal leaves no trace.
  const std::string who = "plugin " + path + " ('" + info.name + "')";
  auto require_array = [&](const void* array, size_t n, const char* what) {
    if (n > 0 && !array) throw Error(who + ": descriptor lists " + std::to_string(n) + " " + what + " but the array is null");
  };
  require_array(d->module_kinds, d->n_module_kinds, "module kinds");
  require_array(d->adapters, d->n_adapters, "adapters");
  require_array(d->partitioners, d->n_partitioners, "partition strategies");
  require_array(d->rules, d->n_rules, "rules");
  if (unless_provided) {
    // A capability some loaded plugin already provides: this one is not needed.
    std::string taken;
    for_each_capability(d, [&](const std::string& type, const char* name) {
      if (name && taken.empty() && providers_.count(type + ":" + name)) taken = type + " '" + name + "'";
    });
    if (!taken.empty()) {
      spdlog::debug("plugin {} not loaded: its {} is already provided", path, taken);
      return nullptr;
    }
  }
  check_capabilities(d, info, who);
  register_capabilities(d, info);
  spdlog::debug("loaded plugin '{}' {} (ABI {}.{}) from {}", info.name, info.version, info.abi_major, info.abi_minor,
                path);
  infos_.push_back(std::move(info));
  return &infos_.back();
}

namespace {

// The 2.5 descriptor extensions: the plugin's configuration tables and its memory contract.
template <class Claim>
void check_extensions(const smp_plugin_descriptor* d, PluginInfo& info, const std::string& who, Claim& claim) {
  const std::string& path = info.path;
  if (const smp_config_extension* c = config_of(d)) {
    require_size(&c->base, SMP_CONFIG_EXTENSION_STRUCT_SIZE, "config extension", path, "2.5");
    if (c->n_tables > 0 && !c->tables)
      throw Error(who + ": config extension lists " + std::to_string(c->n_tables) + " tables but the array is null");
    for (size_t i = 0; i < c->n_tables; ++i) {
      const smp_config_table* t = c->tables[i];
      require_size(t, SMP_CONFIG_TABLE_STRUCT_SIZE, "config table", path, "2.5");
      const std::string name = t->name ? t->name : "";
      if (!is_plugin_table_name(name))
        throw Error(who + ": config table '" + name + "': a plugin's table is named with lower-case letters, "
                    "digits and '_', and is not one of the core's (" + core_tables_text() + ")");
      if (!t->check) throw Error(who + ": config table '" + name + "' lacks its check function");
      info.tables.push_back(claim("config table", t->name));
    }
  }
  if (const smp_memory_extension* m = memory_of(d)) {
    require_size(&m->base, SMP_MEMORY_EXTENSION_STRUCT_SIZE, "memory extension", path, "2.5");
    if ((m->n_kinds > 0 && !m->kinds) || (m->n_rules > 0 && !m->rules))
      throw Error(who + ": memory extension lists entries but an array is null");
    for (size_t i = 0; i < m->n_kinds; ++i) {
      const smp_kind_memory* k = m->kinds[i];
      require_size(k, SMP_KIND_MEMORY_STRUCT_SIZE, "memory extension kind", path, "2.5");
      const std::string kind = k->kind ? k->kind : "";
      if (std::find(info.module_kinds.begin(), info.module_kinds.end(), kind) == info.module_kinds.end())
        throw Error(who + ": memory extension: module kind '" + kind + "' is not one this plugin registers");
    }
    for (size_t i = 0; i < m->n_rules; ++i) {
      const smp_rule_memory* r = m->rules[i];
      require_size(r, SMP_RULE_MEMORY_STRUCT_SIZE, "memory extension rule", path, "2.5");
      const std::string rule = std::string(r->axis ? r->axis : "") + ":" + (r->kind ? r->kind : "");
      if (std::find(info.rules.begin(), info.rules.end(), rule) == info.rules.end())
        throw Error(who + ": memory extension: rule '" + rule + "' is not one this plugin registers");
      if (!(r->param_split >= 0 && r->param_split <= 1) || !(r->activation_split >= 0 && r->activation_split <= 1))
        throw Error(who + ": memory extension: rule '" + rule + "': split fractions must lie in [0, 1]");
    }
  }
  if (const smp_inference_extension* x = inference_of(d)) {
    require_size(&x->base, SMP_INFERENCE_EXTENSION_STRUCT_SIZE, "inference extension", path, "2.7");
    if (x->n_kinds > 0 && !x->kinds) throw Error(who + ": inference extension lists kinds but the array is null");
    for (size_t i = 0; i < x->n_kinds; ++i) {
      const smp_kind_inference* k = x->kinds[i];
      require_size(k, SMP_KIND_INFERENCE_STRUCT_SIZE, "inference extension kind", path, "2.7");
      const std::string kind = k->kind ? k->kind : "";
      const std::string where = who + ": inference extension: module kind '" + kind + "'";
      if (std::find(info.module_kinds.begin(), info.module_kinds.end(), kind) == info.module_kinds.end())
        throw Error(where + " is not one this plugin registers");
      if (k->flags & ~(SMP_INFERENCE_POSITIONWISE | SMP_INFERENCE_DECODE))
        throw Error(where + ": unknown flags " + std::to_string(k->flags));
      if (k->sharded_output < -1 || (k->sharded_output >= 0 && (!k->shard_axis || !*k->shard_axis)))
        throw Error(where + ": a sharded output needs an index >= 0 and a mesh axis");
    }
  }
}

}  // namespace

// Every capability well-formed and not taken; their names into info.
void PluginRegistry::check_capabilities(const smp_plugin_descriptor* d, PluginInfo& info, const std::string& who) const {
  const std::string& path = info.path;
  std::set<std::string> seen;
  auto claim = [&](const std::string& type, const char* name) {
    if (!name || !*name) throw Error(who + ": a " + type + " without a name");
    std::string key = type + ":" + name;
    if (providers_.count(key))
      throw Error(who + ": " + type + " '" + name + "' is already registered by plugin '" + providers_.at(key) + "'");
    if (!seen.insert(key).second) throw Error(who + ": " + type + " '" + name + "' registered twice");
    return std::string(name);
  };
  for (size_t i = 0; i < d->n_module_kinds; ++i) {
    const smp_module_kind* k = d->module_kinds[i];
    require_size(k, SMP_MODULE_KIND_STRUCT_SIZE_2_0, "module kind", path);
    if (!k->create || !k->forward || !k->parameters || !k->destroy)
      throw Error(who + ": module kind '" + (k->name ? k->name : "?") + "' lacks a function");
    info.module_kinds.push_back(claim("module kind", k->name));
  }
  for (size_t i = 0; i < d->n_adapters; ++i) {
    const smp_model_adapter* a = d->adapters[i];
    require_size(a, SMP_MODEL_ADAPTER_STRUCT_SIZE, "model adapter", path);
    if (!a->create || !a->describe || !a->batch || !a->destroy)
      throw Error(who + ": adapter '" + (a->name ? a->name : "?") + "' lacks a function");
    info.adapters.push_back(claim("adapter", a->name));
  }
  for (size_t i = 0; i < d->n_partitioners; ++i) {
    const smp_partition_strategy* p = d->partitioners[i];
    require_size(p, SMP_PARTITION_STRATEGY_STRUCT_SIZE, "partition strategy", path);
    if (!p->partition) throw Error(who + ": partition strategy lacks its function");
    info.partitioners.push_back(claim("partition strategy", p->name));
  }
  for (size_t i = 0; i < d->n_rules; ++i) {
    const smp_rule* r = d->rules[i];
    require_size(r, SMP_RULE_STRUCT_SIZE_2_0, "rule", path);
    const std::string axis = r->axis ? r->axis : "";
    // tp, ep, or an axis a job declares (parallel.axes); not the pipeline or data axes.
    const bool core_only = builtin_axis(axis) && !rules_apply(builtin_axis(axis)->role);
    if (core_only || !is_axis_name(axis))
      throw Error(who + ": rule for kind '" + (r->kind ? r->kind : "?") + "' names axis '" + axis +
                  "'; rules exist for \"tp\", \"ep\" and the model axes a job declares (parallel.axes: "
                  "lower-case names, not pp, dp, edp, mp or world)");
    if (!r->dist_kind || !*r->dist_kind) throw Error(who + ": " + axis + " rule without a dist_kind");
    claim(axis + " rule", r->kind);
    info.rules.push_back(axis + ":" + r->kind);
  }
  if (const smp_optimizers_extension* o = optimizers_of(d)) {
    require_size(&o->base, SMP_OPTIMIZERS_EXTENSION_STRUCT_SIZE, "optimizers extension", path, "2.3");
    if (o->n_kinds > 0 && !o->kinds)
      throw Error(who + ": optimizers extension lists " + std::to_string(o->n_kinds) + " kinds but the array is null");
    for (size_t i = 0; i < o->n_kinds; ++i) {
      const smp_optimizer_kind* k = o->kinds[i];
      require_size(k, SMP_OPTIMIZER_KIND_STRUCT_SIZE, "optimizer kind", path, "2.3");
      if (!k->create || !k->step || !k->state_tensors || !k->destroy)
        throw Error(who + ": optimizer '" + (k->name ? k->name : "?") + "' lacks a function");
      info.optimizers.push_back(claim("optimizer", k->name));
    }
  }
  check_extensions(d, info, who, claim);
}

void PluginRegistry::register_capabilities(const smp_plugin_descriptor* d, const PluginInfo& info) {
  for (size_t i = 0; i < d->n_module_kinds; ++i) kinds_[d->module_kinds[i]->name] = d->module_kinds[i];
  for (size_t i = 0; i < d->n_adapters; ++i) adapters_[d->adapters[i]->name] = d->adapters[i];
  for (size_t i = 0; i < d->n_partitioners; ++i) partitioners_[d->partitioners[i]->name] = d->partitioners[i];
  for (size_t i = 0; i < d->n_rules; ++i) rules_[std::string(d->rules[i]->axis) + ":" + d->rules[i]->kind] = d->rules[i];
  if (const smp_optimizers_extension* o = optimizers_of(d))
    for (size_t i = 0; i < o->n_kinds; ++i) optimizers_[o->kinds[i]->name] = o->kinds[i];
  if (const smp_config_extension* c = config_of(d))
    for (size_t i = 0; i < c->n_tables; ++i) tables_[c->tables[i]->name] = c->tables[i];
  // The memory contract: the 2.5 extension when the plugin has one, else the 2.1 fields.
  const smp_memory_extension* m = memory_of(d);
  for (size_t i = 0; i < d->n_module_kinds; ++i) {
    const smp_module_kind* k = d->module_kinds[i];
    features_[k->name] = !m && SMP_HAS_FIELD(k, smp_module_kind, memory_features) ? k->memory_features : 0u;
  }
  for (size_t i = 0; i < d->n_rules; ++i) {
    const smp_rule* r = d->rules[i];
    const bool known = !m && SMP_HAS_FIELD(r, smp_rule, activation_split);  // minor 0: splits everything
    splits_[std::string(r->axis) + ":" + r->kind] = {known ? r->param_split : 1.0, known ? r->activation_split : 1.0};
  }
  if (m) {
    for (size_t i = 0; i < m->n_kinds; ++i) features_[m->kinds[i]->kind] = m->kinds[i]->features;
    for (size_t i = 0; i < m->n_rules; ++i)
      splits_[std::string(m->rules[i]->axis) + ":" + m->rules[i]->kind] = {m->rules[i]->param_split,
                                                                           m->rules[i]->activation_split};
  }
  if (const smp_inference_extension* x = inference_of(d))
    for (size_t i = 0; i < x->n_kinds; ++i) {
      const smp_kind_inference* k = x->kinds[i];
      KindInference& entry = inference_[std::string(k->kind) + ":" + (k->method ? k->method : "")];
      entry.flags = k->flags;
      if (k->sharded_output >= 0) entry.sharded_output = k->sharded_output, entry.shard_axis = k->shard_axis,
                                  entry.shard_dim = k->shard_dim;
    }
  for_each_capability(d, [&](const std::string& type, const char* name) { providers_[type + ":" + name] = info.name; });
}

KindInference PluginRegistry::inference(const std::string& kind, const std::string& method) const {
  KindInference out;
  auto all = inference_.find(kind + ":");
  if (all != inference_.end()) out = all->second;
  auto one = inference_.find(kind + ":" + method);
  if (one != inference_.end()) {
    out.flags |= one->second.flags;
    if (one->second.sharded_output >= 0) out.sharded_output = one->second.sharded_output,
                                         out.shard_axis = one->second.shard_axis, out.shard_dim = one->second.shard_dim;
  }
  return out;
}

namespace {
template <class Map>
typename Map::mapped_type find_in(const Map& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? nullptr : it->second;
}
}  // namespace

bool PluginRegistry::has_module_kind(const std::string& k) const { return kinds_.count(k) > 0; }
bool PluginRegistry::has_adapter(const std::string& n) const { return adapters_.count(n) > 0; }
bool PluginRegistry::has_partitioner(const std::string& n) const { return partitioners_.count(n) > 0; }
bool PluginRegistry::has_optimizer(const std::string& n) const { return optimizers_.count(n) > 0; }
bool PluginRegistry::has_rule(const std::string& axis, const std::string& k) const {
  return rules_.count(axis + ":" + k) > 0;
}

const smp_module_kind* PluginTables::module_kind(const std::string& k) const { return find_in(r_.kinds_, k); }
const smp_model_adapter* PluginTables::adapter(const std::string& n) const { return find_in(r_.adapters_, n); }
const smp_partition_strategy* PluginTables::partitioner(const std::string& n) const {
  return find_in(r_.partitioners_, n);
}
const smp_optimizer_kind* PluginTables::optimizer(const std::string& n) const { return find_in(r_.optimizers_, n); }
const smp_rule* PluginTables::rule(const std::string& axis, const std::string& k) const {
  return find_in(r_.rules_, axis + ":" + k);
}
uint32_t PluginRegistry::memory_features(const std::string& kind) const {
  auto it = features_.find(kind);
  return it == features_.end() ? 0u : it->second;
}
MemorySplit PluginRegistry::memory_split(const std::string& axis, const std::string& kind) const {
  auto it = splits_.find(axis + ":" + kind);
  return it == splits_.end() ? MemorySplit{} : it->second;
}

nlohmann::json PluginRegistry::check_tables(const nlohmann::json& given, const std::string& origin) const {
  for (const auto& [name, value] : given.items())
    if (!tables_.count(name)) {
      std::string declared;
      std::vector<std::string> names(std::begin(kSchemaTables), std::end(kSchemaTables));
      names.insert(names.end(), std::begin(kFreeTables), std::end(kFreeTables));
      for (const auto& [t, _] : tables_) {
        declared += (declared.empty() ? "" : ", ") + ("[" + t + "] of " + provider("config table", t));
        names.push_back(t);
      }
      const std::string near = nearest_name(name, names);
      throw Error(origin + ": unknown table [" + name + "]" + (near.empty() ? "" : " (did you mean [" + near + "]?)") +
                  ": neither one of the core's (" + core_tables_text() + ") nor one a loaded plugin declares (" +
                  (declared.empty() ? "none" : declared) + ")");
    }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, table] : tables_) {
    const nlohmann::json value = given.contains(name) ? given.at(name) : nlohmann::json::object();
    const std::string text = value.dump();
    smp_error* e = table->check(table->state, text.c_str());
    if (e) {
      const std::string message = host_api()->error_message(e);
      host_api()->error_destroy(e);
      throw Error(origin + ": [" + name + "] (plugin '" + provider("config table", name) + "'): " + message);
    }
    out[name] = value;
  }
  return out;
}

std::string PluginRegistry::provider(const std::string& name) const {
  for (const char* type : {"module kind:", "adapter:", "partition strategy:", "optimizer:", "tp rule:", "ep rule:"}) {
    auto it = providers_.find(type + name);
    if (it != providers_.end()) return it->second;
  }
  return "";
}

std::string PluginRegistry::provider(const std::string& type, const std::string& name) const {
  auto it = providers_.find(type + ":" + name);
  return it == providers_.end() ? "" : it->second;
}

namespace {
template <class M>
std::vector<std::string> keys(const M& m) {
  std::vector<std::string> k;
  for (const auto& [name, _] : m) k.push_back(name);
  return k;
}
}  // namespace
std::vector<std::string> PluginRegistry::module_kinds() const { return keys(kinds_); }
std::vector<std::string> PluginRegistry::adapters() const { return keys(adapters_); }
std::vector<std::string> PluginRegistry::partitioners() const { return keys(partitioners_); }
std::vector<std::string> PluginRegistry::optimizers() const { return keys(optimizers_); }

}  // namespace smp
