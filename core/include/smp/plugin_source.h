// Where a plugin comes from: a shared object (by path or by name, found on
// SMP_PLUGIN_PATH or in the install), or a program's own code (in process).
#pragma once

#include <functional>
#include <string>
#include <type_traits>
#include <utility>

// The C ABI's types (smp/abi.h) by name only: the public API passes an entry
// point through, and only the core's plugin layer reads what it returns.
struct smp_plugin_descriptor;
struct smp_host_api;
struct smp_error;

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

// An in-process plugin's entry point: the same contract as a shared object's
// exported smp_plugin_entry (abi.h). The host calls it once with its API table
// and applies the same version and capability checks to what it returns. The
// SDK makes one from a PluginBuilder (smp::sdk::InProcessPlugin).
using PluginEntry = std::function<const smp_plugin_descriptor*(const smp_host_api*, smp_error**)>;

struct PluginSource {
  PluginSource(std::string path_or_name) : name(std::move(path_or_name)) {}  // NOLINT: implicit on purpose
  PluginSource(const char* path_or_name) : name(path_or_name) {}             // NOLINT
  // `label` stands for the file name in messages and PluginInfo::path ("in process: <label>").
  PluginSource(std::string label, PluginEntry in_process) : name(std::move(label)), entry(std::move(in_process)) {}
  // Anything with label() and entry(): smp::sdk::InProcessPlugin.
  template <class P, class = decltype(std::declval<const P&>().entry()),
            class = decltype(std::declval<const P&>().label())>
  PluginSource(const P& plugin) : name(plugin.label()), entry(plugin.entry()) {}  // NOLINT: implicit on purpose

  bool in_process() const { return static_cast<bool>(entry); }

  std::string name;  // a path or name; for an in-process plugin its label
  PluginEntry entry;  // null for a shared object
};

}  // namespace smp
#pragma GCC visibility pop
