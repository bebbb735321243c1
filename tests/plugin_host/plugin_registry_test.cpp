// PluginRegistry: a good C plugin loads; every defective plugin is refused with
// an smp::Error naming the file and the versions at stake, and leaves the
// registry exactly as it was (a good plugin still loads afterwards).
#include <smp/error.h>
#include "plugin/plugin_tables.h"
#include <smp/plugin_registry.h>

#include "plugin/host_api.h"
#include "plugin/module_instance.h"

#include <gtest/gtest.h>
#include <torch/version.h>

#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

// Boost, not std::filesystem: pip torch's libtorch.so exports its own copy of
// std::filesystem, which interposes on libstdc++'s (remove_all crashed through it).
#include <boost/filesystem.hpp>

namespace {

namespace fs = boost::filesystem;

std::string plugin(const std::string& name) { return std::string(SMP_TEST_PLUGIN_DIR) + "/" + name + ".so"; }

std::string abi(int major, int minor) { return std::to_string(major) + "." + std::to_string(minor); }
const std::string kCoreAbi = abi(SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR);

// Everything observable about a registry's contents.
struct Snapshot {
  std::vector<std::string> kinds, adapters, partitioners, plugins;
  explicit Snapshot(const smp::PluginRegistry& r)
      : kinds(r.module_kinds()), adapters(r.adapters()), partitioners(r.partitioners()) {
    for (const auto& p : r.plugins()) plugins.push_back(p.path);
  }
  bool operator==(const Snapshot& o) const {
    return kinds == o.kinds && adapters == o.adapters && partitioners == o.partitioners && plugins == o.plugins;
  }
};

// Loads `name`, expects a refusal whose message holds the file path and every
// one of `needles`, then checks the registry is unchanged and still usable.
std::string expect_refused(smp::PluginRegistry& reg, const std::string& name, const std::vector<std::string>& needles,
                           const std::string& absent_kind = "") {
  const std::string path = plugin(name);
  EXPECT_TRUE(fs::exists(path)) << path << " was not built";
  Snapshot before(reg);
  std::string message;
  try {
    reg.load(path);
    ADD_FAILURE() << name << " was loaded; it should have been refused";
  } catch (const smp::Error& e) {
    message = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << name << ": refused with a " << typeid(e).name() << " instead of smp::Error: " << e.what();
  }
  EXPECT_NE(message.find(path), std::string::npos) << "message does not name the file: " << message;
  for (const auto& n : needles) EXPECT_NE(message.find(n), std::string::npos) << "'" << n << "' missing from: " << message;
  EXPECT_TRUE(Snapshot(reg) == before) << "the refusal of " << name << " changed the registry";
  if (!absent_kind.empty()) {
    EXPECT_EQ(smp::PluginTables(reg).module_kind(absent_kind), nullptr) << absent_kind << " was registered by a refused plugin";
    EXPECT_EQ(reg.provider(absent_kind), "");
  }
  // A refusal is not remembered as a load: trying again refuses again.
  EXPECT_THROW(reg.load(path), smp::Error);
  // And the registry still takes a good plugin.
  const auto& good = reg.load(plugin("good_c_plugin"));
  EXPECT_EQ(good.name, "good_c_plugin");
  EXPECT_NE(smp::PluginTables(reg).module_kind("good_c_kind"), nullptr);
  return message;
}

TEST(PluginRegistry, LoadsAPluginWrittenInC) {
  smp::PluginRegistry reg;
  const smp::PluginInfo& info = reg.load(plugin("good_c_plugin"));
  EXPECT_EQ(info.name, "good_c_plugin");
  EXPECT_EQ(info.version, "0.0.1");
  EXPECT_EQ(info.abi_major, static_cast<uint32_t>(SMP_ABI_VERSION_MAJOR));
  EXPECT_EQ(info.abi_minor, static_cast<uint32_t>(SMP_ABI_VERSION_MINOR));
  EXPECT_EQ(info.torch_version, "");
  EXPECT_EQ(info.path, fs::canonical(plugin("good_c_plugin")).string());
  EXPECT_EQ(info.module_kinds, std::vector<std::string>{"good_c_kind"});
  EXPECT_EQ(reg.module_kinds(), std::vector<std::string>{"good_c_kind"});
  EXPECT_EQ(reg.provider("good_c_kind"), "good_c_plugin");
  ASSERT_EQ(reg.plugins().size(), 1u);

  // Its module kind works through the ABI: create, parameters, forward (an error), destroy.
  const smp_module_kind* kind = smp::PluginTables(reg).module_kind("good_c_kind");
  ASSERT_NE(kind, nullptr);
  smp_module_context ctx{};
  ctx.struct_size = SMP_MODULE_CONTEXT_STRUCT_SIZE;
  ctx.node_name = "c";
  smp_module* m = nullptr;
  smp::throw_if_error(kind->create(kind->state, "{}", &ctx, &m), "create");
  ASSERT_NE(m, nullptr);
  int visited = 0;
  smp::throw_if_error(kind->parameters(m, [](void* u, const smp_param_info*) { ++*static_cast<int*>(u); }, &visited),
                      "parameters");
  EXPECT_EQ(visited, 0);
  smp_forward_args args{};
  args.struct_size = SMP_FORWARD_ARGS_STRUCT_SIZE;
  try {
    smp::throw_if_error(kind->forward(m, &args), "good_c_kind forward");
    ADD_FAILURE() << "forward should report 'not implemented'";
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not implemented"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("UNSUPPORTED"), std::string::npos) << e.what();
  }
  kind->destroy(m);
}

TEST(PluginRegistry, LoadingTheSameFileTwiceIsANoOp) {
  smp::PluginRegistry reg;
  const smp::PluginInfo& a = reg.load(plugin("good_c_plugin"));
  const smp::PluginInfo& b = reg.load(plugin("good_c_plugin"));
  EXPECT_EQ(&a, &b);
  EXPECT_EQ(reg.plugins().size(), 1u);
}

TEST(PluginRegistry, InfoReferencesStayValidAcrossLoads) {
  smp::PluginRegistry reg;
  const smp::PluginInfo& first = reg.load(plugin("good_c_plugin"));
  for (const char* other : {"dup_kind_a", "example_scale_intree"}) reg.load(plugin(other));
  // Loading the same file again returns the stored info: it must not have moved.
  EXPECT_EQ(&reg.load(plugin("good_c_plugin")), &first);
  EXPECT_EQ(first.name, "good_c_plugin");
  EXPECT_EQ(reg.plugins().size(), 3u);
}

TEST(PluginRegistry, FindsPluginsByNameOnSMP_PLUGIN_PATH) {
  ASSERT_EQ(setenv("SMP_PLUGIN_PATH", "/nonexistent/smp:" SMP_TEST_PLUGIN_DIR, 1), 0);
  auto path = smp::PluginRegistry::search_path();
  ASSERT_GE(path.size(), 3u);
  EXPECT_EQ(path[0], "/nonexistent/smp");
  EXPECT_EQ(path[1], SMP_TEST_PLUGIN_DIR);
  EXPECT_EQ(smp::PluginRegistry::resolve("good_c_plugin"), fs::canonical(plugin("good_c_plugin")).string());
  EXPECT_EQ(smp::PluginRegistry::resolve("good_c_plugin.so"), fs::canonical(plugin("good_c_plugin")).string());
  smp::PluginRegistry reg;
  EXPECT_EQ(reg.load("good_c_plugin").name, "good_c_plugin");
  EXPECT_EQ(&reg.load("good_c_plugin.so"), &reg.load("good_c_plugin"));
  EXPECT_EQ(reg.plugins().size(), 1u);
  try {
    reg.load("no_such_plugin");
    ADD_FAILURE() << "an unknown name loaded";
  } catch (const smp::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("no_such_plugin"), std::string::npos) << m;
    EXPECT_NE(m.find("/nonexistent/smp"), std::string::npos) << "the message should list the folders searched: " << m;
    EXPECT_NE(m.find(SMP_TEST_PLUGIN_DIR), std::string::npos) << m;
  }
  unsetenv("SMP_PLUGIN_PATH");
}

TEST(PluginRegistry, RefusesAMissingFile) {
  smp::PluginRegistry reg;
  try {
    reg.load("/nonexistent/dir/plugin.so");
    ADD_FAILURE();
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/plugin.so"), std::string::npos) << e.what();
  }
}

TEST(PluginRegistry, RefusesAFileThatIsNotASharedObject) {
  fs::path dir = fs::temp_directory_path() / ("smp_not_a_plugin_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::path fake = dir / "fake.so";
  std::ofstream(fake) << "this is not an ELF file\n";
  smp::PluginRegistry reg;
  try {
    reg.load(fake.string());
    ADD_FAILURE();
  } catch (const smp::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(fs::canonical(fake).string()), std::string::npos) << m;
    // Refused by the ELF check before dlopen (plugin_file_test has the rest).
    EXPECT_NE(m.find("is not a shared object: it does not start with the ELF magic"), std::string::npos) << m;
  }
  EXPECT_TRUE(reg.plugins().empty());
  fs::remove_all(dir);
}

TEST(PluginRegistry, RefusesAMissingEntrySymbol) {
  smp::PluginRegistry reg;
  expect_refused(reg, "bad_no_entry", {"missing entry symbol", SMP_PLUGIN_ENTRY_SYMBOL}, "bad_no_entry_kind");
}

TEST(PluginRegistry, RefusesAnotherAbiMajor) {
  smp::PluginRegistry reg;
  expect_refused(reg, "bad_major",
                 {"built for smp ABI " + abi(SMP_ABI_VERSION_MAJOR + 1, 0), "core has ABI " + kCoreAbi},
                 "bad_major_kind");
}

TEST(PluginRegistry, RefusesANewerAbiMinor) {
  smp::PluginRegistry reg;
  expect_refused(reg, "bad_newer_minor",
                 {"built for smp ABI " + abi(SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR + 1), kCoreAbi, "newer"},
                 "bad_newer_minor_kind");
}

TEST(PluginRegistry, RefusesAnotherLibTorch) {
  smp::PluginRegistry reg;
  expect_refused(reg, "bad_torch_version",
                 {"LibTorch 0.0.0-bad", std::string("LibTorch ") + TORCH_VERSION, "'bad_torch_version'"},
                 "bad_torch_version_kind");
  EXPECT_STREQ(smp::host_api()->torch_version, TORCH_VERSION);
}

TEST(PluginRegistry, RefusesADescriptorSmallerThanTheAbiRequires) {
  smp::PluginRegistry reg;
  const std::string have = std::to_string(SMP_STRUCT_SIZE(smp_plugin_descriptor, torch_version));
  const std::string need = std::to_string(SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE);
  expect_refused(reg, "bad_small_descriptor", {"descriptor struct_size " + have, need, abi(SMP_ABI_VERSION_MAJOR, 0)},
                 "bad_small_descriptor_kind");
}

TEST(PluginRegistry, RefusesADescriptorTooSmallToHoldAVersion) {
  smp::PluginRegistry reg;
  expect_refused(reg, "bad_tiny_descriptor", {"descriptor struct_size " + std::to_string(sizeof(size_t))},
                 "bad_tiny_descriptor_kind");
}

TEST(PluginRegistry, RefusesASecondPluginRegisteringTheSameKind) {
  smp::PluginRegistry reg;
  reg.load(plugin("dup_kind_a"));
  ASSERT_EQ(reg.provider("dup_kind"), "dup_kind_a");
  const smp_module_kind* owner = smp::PluginTables(reg).module_kind("dup_kind");
  expect_refused(reg, "dup_kind_b", {"module kind 'dup_kind'", "'dup_kind_a'", "'dup_kind_b'"},
                 "dup_kind_b_only");
  EXPECT_EQ(reg.provider("dup_kind"), "dup_kind_a");
  EXPECT_EQ(smp::PluginTables(reg).module_kind("dup_kind"), owner);
}

TEST(PluginRegistry, DuplicateKindIsRefusedWhicheverLoadsFirst) {
  smp::PluginRegistry reg;
  reg.load(plugin("dup_kind_b"));
  EXPECT_NE(smp::PluginTables(reg).module_kind("dup_kind_b_only"), nullptr);
  expect_refused(reg, "dup_kind_a", {"module kind 'dup_kind'", "'dup_kind_b'"});
  EXPECT_EQ(reg.provider("dup_kind"), "dup_kind_b");
}

TEST(PluginRegistry, RefusalByThePluginCarriesItsReason) {
  smp::PluginRegistry reg;
  expect_refused(reg, "bad_refuses_host",
                 {"refused to load into smp ABI " + kCoreAbi,
                  "needs smp ABI " + abi(SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR + 99),
                  "the host offers " + kCoreAbi, "UNSUPPORTED"});
}

TEST(PluginRegistry, EveryRefusalInOneRegistryLeavesItUsable) {
  smp::PluginRegistry reg;
  reg.load(plugin("good_c_plugin"));
  Snapshot before(reg);
  for (const char* bad : {"bad_no_entry", "bad_major", "bad_newer_minor", "bad_torch_version", "bad_small_descriptor",
                          "bad_tiny_descriptor", "bad_refuses_host", "old_v1", "needs_extension"})
    EXPECT_THROW(reg.load(plugin(bad)), smp::Error) << bad;
  EXPECT_TRUE(Snapshot(reg) == before);
  EXPECT_EQ(reg.load(plugin("dup_kind_a")).name, "dup_kind_a");
  EXPECT_EQ(reg.plugins().size(), 2u);
}

TEST(PluginRegistry, RefusesAnAbi1PluginByNameAndVersion) {
  smp::PluginRegistry reg;
  expect_refused(reg, "old_v1",
                 {"'old_v1 0.0.1'", "built for smp ABI 1.0", "core has ABI " + kCoreAbi, "rebuild the plugin"},
                 "old_v1_kind");
}

// Calls a plugin's entry point directly with a given host table.
const smp_plugin_descriptor* enter(const std::string& name, const smp_host_api* host, std::string* error) {
  void* lib = ::dlopen(plugin(name).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw std::runtime_error(::dlerror());
  auto entry = reinterpret_cast<smp_plugin_entry_fn>(::dlsym(lib, SMP_PLUGIN_ENTRY_SYMBOL));
  if (!entry) throw std::runtime_error("no entry point in " + name);
  smp_error* err = nullptr;
  const smp_plugin_descriptor* d = entry(host, &err);
  *error = smp::consume_error(err);
  return d;  // the library stays loaded: the descriptor lives in it
}

// A host of the next minor with an extension chain: one type this SDK never
// heard of, then (optionally) the one needs_extension requires.
struct FutureHost {
  smp_extension_base unknown{}, needed{};
  smp_host_api table{};
  explicit FutureHost(bool with_needed) {
    unknown.struct_size = SMP_EXTENSION_BASE_STRUCT_SIZE;
    unknown.type = SMP_EXTENSION_PRIVATE_BASE + 7;
    unknown.version = 3;
    needed.struct_size = SMP_EXTENSION_BASE_STRUCT_SIZE;
    needed.type = SMP_EXTENSION_PRIVATE_BASE + 42;
    needed.version = 1;
    unknown.next = with_needed ? &needed : nullptr;
    table = *smp::host_api();
    table.abi_minor = SMP_ABI_VERSION_MINOR + 1;
    table.extension_start = &unknown;
  }
};

TEST(PluginRegistry, APluginOfMinor0LoadsInACoreOfTheNextMinorWithAnExtension) {
  // Built against this header (minor SMP_ABI_VERSION_MINOR): skips the unknown extension.
  static FutureHost host(false);  // the plugin keeps the table: it must outlive the test
  std::string error;
  const smp_plugin_descriptor* d = enter("example_scale_intree", &host.table, &error);
  ASSERT_NE(d, nullptr) << error;
  EXPECT_EQ(error, "");
  EXPECT_EQ(d->abi_major, static_cast<uint32_t>(SMP_ABI_VERSION_MAJOR));
  EXPECT_EQ(d->abi_minor, static_cast<uint32_t>(SMP_ABI_VERSION_MINOR));
  EXPECT_GE(d->n_module_kinds, 1u);
  // Put the real table back for the rest of this process.
  ASSERT_NE(enter("example_scale_intree", smp::host_api(), &error), nullptr) << error;
}

// The SDK checks features, not the minor: a plugin built against this header
// (minor SMP_ABI_VERSION_MINOR) loads into a host that says minor 0 and has
// only the 2.0 table, and refuses only a table smaller than 2.0's, naming the
// sizes. (A later host function is checked where it is called, e.g. metric().)
TEST(PluginRegistry, AnSdkPluginAcceptsAnOlderMinorHostWithTheTableItCalls) {
  static smp_host_api old_host = *smp::host_api();  // the plugin keeps the table
  old_host.abi_minor = 0;
  old_host.struct_size = SMP_HOST_API_STRUCT_SIZE_2_0;
  std::string error;
  const smp_plugin_descriptor* d = enter("example_scale_intree", &old_host, &error);
  ASSERT_NE(d, nullptr) << error;
  EXPECT_EQ(d->abi_minor, static_cast<uint32_t>(SMP_ABI_VERSION_MINOR));
  static smp_host_api short_host = *smp::host_api();
  short_host.struct_size = SMP_HOST_API_STRUCT_SIZE_2_0 - sizeof(void*);
  EXPECT_EQ(enter("example_scale_intree", &short_host, &error), nullptr);
  EXPECT_NE(error.find("host table of at least " + std::to_string(SMP_HOST_API_STRUCT_SIZE_2_0) + " bytes"),
            std::string::npos)
      << error;
  // Put the real table back for the rest of this process.
  ASSERT_NE(enter("example_scale_intree", smp::host_api(), &error), nullptr) << error;
}

TEST(PluginRegistry, APluginNeedingAMissingHostExtensionIsRefusedNamingIt) {
  smp::PluginRegistry reg;
  expect_refused(reg, "needs_extension",
                 {"refused to load into smp ABI " + kCoreAbi, "needs the host extension 'test.needed'",
                  "does not provide", "UNSUPPORTED"},
                 "needs_extension_identity");
  // The same plugin accepts a host that has it, anywhere in the chain.
  static FutureHost host(true);
  std::string error;
  const smp_plugin_descriptor* d = enter("needs_extension", &host.table, &error);
  ASSERT_NE(d, nullptr) << error;
  EXPECT_EQ(std::string(d->name), "needs_extension");
  ASSERT_EQ(enter("needs_extension", smp::host_api(), &error), nullptr);
  EXPECT_NE(error.find("test.needed"), std::string::npos) << error;
}

// A partial gradient over a data axis would be summed by the data-parallel
// reduction and again as a partial (the gradient dp times too large): the
// module is refused when made, naming the plugin, parameter and axis.
TEST(PluginRegistry, APartialGradientOverDpIsRefusedNamingParameterAxisAndPlugin) {
  smp::PluginRegistry reg;
  reg.load(plugin("partial_on_dp"));
  const smp_module_kind* kind = smp::PluginTables(reg).module_kind("partial_on_dp_kind");
  ASSERT_NE(kind, nullptr);
  const std::string key = "blocks.0.scale";
  try {
    smp::ModuleInstance m(kind, reg.provider("partial_on_dp_kind"), key, "{}",
                          smp::module_context(key, 1, nullptr, "{}"));
    FAIL() << "a partial gradient over dp was accepted";
  } catch (const smp::Error& e) {
    const std::string msg = e.what();
    for (const std::string part : {"plugin 'partial_on_dp'", "parameter 'blocks.0.scale.weight'",
                                   "partial gradient on axis \"dp\" is refused"})
      EXPECT_NE(msg.find(part), std::string::npos) << "missing '" << part << "' in: " << msg;
  }
}

// The standard plugins yield to a loaded plugin that provides a capability of
// theirs, decided on what is registered (not on an error's text).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const smp::Error& e) {
    return e.what();
  }
  return "";
}

// ABI 2.5: the memory contract is SMP_EXTENSION_MEMORY. A host believes it over
// the 2.1 fields of a plugin that says both (here they disagree on purpose);
// the SDK's plugins say the same in both forms.
TEST(PluginRegistry, TheMemoryExtensionSupersedesTheFieldsOf21) {
  smp::PluginRegistry reg;
  reg.load(plugin("memory_ext_c_plugin"));
  EXPECT_EQ(reg.memory_features("mem_c_kind"), SMP_MEMORY_FEATURE_DEFERRED_INIT);  // the field says recompute
  EXPECT_DOUBLE_EQ(reg.memory_split("tp", "mem_c_serial").params, 1.0);         // the fields say 0.25
  EXPECT_DOUBLE_EQ(reg.memory_split("tp", "mem_c_serial").activations, 0.5);
  reg.load("smp_tp");
  EXPECT_EQ(reg.memory_features("parallel_attention"),
            SMP_MEMORY_FEATURE_DEFERRED_INIT | SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE);
  EXPECT_EQ(reg.memory_features("dist_dropout"), 0u);
  EXPECT_DOUBLE_EQ(reg.memory_split("tp", "linear").activations, 0.5);
  EXPECT_DOUBLE_EQ(reg.memory_split("tp", "layer_norm").params, 0.0);
  EXPECT_DOUBLE_EQ(reg.memory_split("tp", "embedding").params, 1.0);  // not listed: splits everything
  // A plugin without the extension: its 2.1 fields.
  reg.load(plugin("good_c_plugin"));
  EXPECT_EQ(reg.memory_features("good_c_kind"), 0u);
}

TEST(PluginRegistry, AMemoryExtensionAboutAKindItDoesNotRegisterIsRefused) {
  smp::PluginRegistry reg;
  expect_refused(reg, "bad_memory_ext", {"memory extension", "'someone_elses_kind'", "not one this plugin registers"},
                 "bad_mem_kind");
}

// ABI 2.5's SMP_EXTENSION_CONFIG: each plugin's table of the job is checked by
// the plugin (every declared one, {} when not given); one no plugin declares is
// refused naming the file and the tables that exist.
TEST(PluginRegistry, APluginsConfigTableIsCheckedByItAndAnUndeclaredOneIsRefused) {
  smp::PluginRegistry reg;
  EXPECT_EQ(reg.load(plugin("memory_ext_c_plugin")).tables, std::vector<std::string>{"mem_c"});
  reg.load("smp_tp");
  using nlohmann::json;
  EXPECT_EQ(reg.check_tables(json{{"mem_c", {{"ok", true}}}}, "job.toml"),
            (json{{"mem_c", {{"ok", true}}}, {"tp", json::object()}}));
  EXPECT_NE(error_of([&] { reg.check_tables(json{{"mem_c", {{"bad", 1}}}}, "job.toml"); })
                .find("job.toml: [mem_c] (plugin 'memory_ext_c_plugin'): mem_c: only the key 'ok'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { reg.check_tables(json{{"tp", {{"sequence_parallel", "yes"}}}}, "job.toml"); })
                .find("job.toml: [tp] (plugin 'smp_tp'): tp.sequence_parallel: expected a boolean"),
            std::string::npos);
  const std::string unknown = error_of([&] { reg.check_tables(json{{"mem_d", json::object()}}, "job.toml"); });
  for (const char* needle : {"job.toml: unknown table [mem_d] (did you mean [mem_c]?)", "[mem_c] of memory_ext_c_plugin",
                             "[tp] of smp_tp"})
    EXPECT_NE(unknown.find(needle), std::string::npos) << needle << " missing from: " << unknown;
}

TEST(PluginRegistry, LoadUnlessProvidedSkipsAPluginWhoseCapabilityIsTaken) {
  smp::PluginRegistry reg;
  reg.load(plugin("dup_kind_a"));
  const Snapshot before(reg);
  EXPECT_EQ(reg.load_unless_provided(plugin("dup_kind_b")), nullptr);
  EXPECT_TRUE(Snapshot(reg) == before);
  const smp::PluginInfo* good = reg.load_unless_provided(plugin("good_c_plugin"));
  ASSERT_NE(good, nullptr);
  EXPECT_EQ(good->name, "good_c_plugin");
  EXPECT_THROW(reg.load(plugin("dup_kind_b")), smp::Error);  // load() still refuses it
}

}  // namespace
