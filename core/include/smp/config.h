// The job configuration: a TOML file plus `--set a.b=c` overrides, checked
// against a schema (core/src/base/config.cpp). Every error names the file (or the
// --set argument), the dotted key and what was expected.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

// An override and how messages name it: smp-launch's command line says
// "--set a.b=c", a program's own argument or smp::Options just "a.b=c".
struct ConfigOverride {
  std::string key_value;        // "a.b=value"
  std::string label = "--set ";  // put before key_value in messages
};

class Config {
 public:
  // Reads `path` (TOML), applies `overrides` ("a.b=value", value parsed as a
  // TOML value, else taken as a string) in order, validates. Throws smp::Error.
  static Config load(const std::string& path, const std::vector<std::string>& overrides = {});
  // The same with overrides that say how messages name them (smp::Options).
  static Config load_labelled(const std::string& path, const std::vector<ConfigOverride>& overrides);
  // Same from a string; `origin_name` stands for the file name in messages.
  static Config from_string(const std::string& toml, const std::string& origin_name,
                            const std::vector<std::string>& overrides = {});
  static Config from_string_labelled(const std::string& toml, const std::string& origin_name,
                                     const std::vector<ConfigOverride>& overrides);

  // The value or the schema default. Works for schema keys ("train.steps") and
  // for keys of the free-form tables ("model.hidden", which must be present).
  // get_double accepts integers. Throws smp::Error for unknown keys/wrong types.
  int64_t get_int(const std::string& dotted_key) const;
  double get_double(const std::string& dotted_key) const;
  bool get_bool(const std::string& dotted_key) const;
  std::string get_string(const std::string& dotted_key) const;
  std::vector<std::string> get_string_array(const std::string& dotted_key) const;
  std::vector<int64_t> get_int_array(const std::string& dotted_key) const;
  // True when the key was given (file or --set); schema defaults don't count.
  bool has(const std::string& dotted_key) const;

  // One table as JSON: the free-form [model]/[partition] as written ({} when
  // absent), a schema table ("train", ...) with its defaults filled in.
  nlohmann::json section_json(const std::string& table) const;
  // The tables the core neither checks nor owns, by name, as given: plugins'
  // tables (SMP_EXTENSION_CONFIG), checked once the plugins are loaded.
  nlohmann::json plugin_tables() const;
  // The fully resolved configuration (every schema key, defaults included;
  // parallel.dp is null until resolve_layout) plus [model] and [partition].
  nlohmann::json to_json() const;

  // Fills parallel.dp when omitted (world / (pp*tp)) and checks the layout:
  // pp*tp*dp == world, train.batch_size % (dp*microbatches) == 0, virtual
  // stages only with interleaved-1f1b, interleaved-1f1b needs microbatches % pp == 0.
  void resolve_layout(int world_size);

  // Every schema key with its type, default, accepted values and meaning, as
  // a markdown document (docs/config-reference.md is this, checked by a test).
  static std::string reference();

  // The file path (or origin name) used in messages.
  const std::string& origin() const { return origin_; }
  // Where a key's value came from, for messages: the `--set` argument that
  // gave it last ("--set parallel.tp=3"), else the file.
  std::string origin_of(const std::string& dotted_key) const;
  // For a message about several keys: the --set argument of the first of them
  // given by one, else the file.
  std::string origin_of_any(const std::vector<std::string>& dotted_keys) const;

 private:
  Config() = default;
  const nlohmann::json* find(const std::string& dotted_key) const;
  std::string origin_;
  nlohmann::json values_ = nlohmann::json::object();  // what was given, normalised
  nlohmann::json set_by_ = nlohmann::json::object();  // dotted key -> the --set argument that gave it
};

}  // namespace smp
#pragma GCC visibility pop
