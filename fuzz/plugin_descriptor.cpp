// The plugin descriptor checks (core/src/plugin/plugin_registry.cpp): the
// input is decoded into smp_plugin_descriptors, each handed to
// PluginRegistry::add as an in-process plugin's entry returns it: the same
// version, size and capability checks a shared object's descriptor gets.
//
// A descriptor is native memory, not a file: the fuzzer cannot make a plugin
// lie about its pointers, only about everything else. So every struct is
// allocated with exactly the bytes its struct_size claims (AddressSanitizer
// then catches a read of a field the plugin never had), its counts, names,
// null pointers, versions, extension types and split fractions come from the
// input, and the function pointers are real functions or null.
#include "support/fuzz_target.h"

#include <smp/error.h>
#include <smp/abi.h>
#include <smp/plugin_registry.h>

#include <torch/version.h>

#include <cstdlib>
#include <deque>
#include <memory>

namespace {

smp_error* module_create(void*, const char*, const smp_module_context*, smp_module**) { return nullptr; }
smp_error* module_forward(smp_module*, const smp_forward_args*) { return nullptr; }
smp_error* module_parameters(smp_module*, smp_param_visitor, void*) { return nullptr; }
void module_destroy(smp_module*) {}
smp_error* adapter_create(void*, const char*, const smp_adapter_context*, smp_adapter**) { return nullptr; }
smp_error* adapter_describe(smp_adapter*, smp_graph_builder*) { return nullptr; }
smp_error* adapter_batch(smp_adapter*, const smp_batch_request*, smp_tensor**, size_t) { return nullptr; }
void adapter_destroy(smp_adapter*) {}
smp_error* partition(void*, const smp_partition_request*) { return nullptr; }
smp_error* rule_check(void*, const char*, int32_t) { return nullptr; }
smp_error* optimizer_create(void*, const smp_optimizer_create_args*, smp_optimizer**) { return nullptr; }
smp_error* optimizer_step(smp_optimizer*, const smp_optimizer_step_args*) { return nullptr; }
smp_error* optimizer_state(smp_optimizer*, smp_optimizer_state_visitor, void*) { return nullptr; }
void optimizer_destroy(smp_optimizer*) {}
smp_error* table_check(void*, const char*) { return nullptr; }

// Reads the input front to back; past its end every read is 0.
class Bytes {
 public:
  Bytes(const uint8_t* d, size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  uint8_t u8() { return i_ < n_ ? d_[i_++] : 0; }
  uint32_t u32() {
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) v |= static_cast<uint32_t>(u8()) << (8 * k);
    return v;
  }
  double fraction() {  // mostly in [0, 1], sometimes outside it or not a number
    const uint8_t b = u8();
    if (b == 255) return std::nan("");
    if (b >= 240) return -1.0 + (b - 240) * 0.25;
    return b / 200.0;
  }

 private:
  const uint8_t* d_;
  size_t n_, i_ = 0;
};

// Owns what a descriptor points at for as long as the registry may read it.
struct Arena {
  std::deque<std::string> strings;
  std::vector<std::unique_ptr<char, decltype(&std::free)>> blocks;
  std::deque<std::vector<const void*>> arrays;

  // A name: null, one a real plugin uses, or raw bytes (NUL ends it early).
  const char* name(Bytes& in) {
    static const char* const kKnown[] = {"tp", "ep", "cp", "pp", "dp", "linear", "attention", "gpt", "adamw",
                                         "model", "parallel", "tp_extra", "", "balanced", TORCH_VERSION, "x"};
    const uint8_t b = in.u8();
    if (b == 255) return nullptr;
    if (b < 128) return kKnown[b % 16];
    std::string s;
    for (int k = 0; k < (b & 15); ++k) s += static_cast<char>(in.u8());
    strings.push_back(s);
    return strings.back().c_str();
  }

  // `full` copied into a block of exactly the size its struct_size claims
  // (at least the struct_size field), struct_size set to that claim.
  template <class T>
  const T* place(Bytes& in, T full) {
    const uint8_t b = in.u8();
    const size_t claim = b < 200 ? sizeof(T) : b < 250 ? static_cast<size_t>(b - 200) * 4 : sizeof(T) + 8 * (b - 249);
    const size_t bytes = std::max(sizeof(size_t), std::min(claim, sizeof(T)));
    char* p = static_cast<char*>(std::malloc(bytes));
    blocks.emplace_back(p, &std::free);
    full.struct_size = claim;
    std::memcpy(p, &full, bytes);
    return reinterpret_cast<const T*>(p);
  }
  // Extensions keep their size in base.struct_size.
  template <class T>
  const smp_extension_base* place_extension(Bytes& in, T full) {
    const uint8_t b = in.u8();
    const size_t claim = b < 200 ? sizeof(T) : b < 250 ? static_cast<size_t>(b - 200) * 4 : sizeof(T) + 8 * (b - 249);
    const size_t bytes = std::max(sizeof(smp_extension_base), std::min(claim, sizeof(T)));
    char* p = static_cast<char*>(std::malloc(bytes));
    blocks.emplace_back(p, &std::free);
    full.base.struct_size = claim;
    std::memcpy(p, &full, bytes);
    return reinterpret_cast<const smp_extension_base*>(p);
  }

  // n pointers made by make(), some null; the array itself null when the input says so.
  template <class T, class Make>
  const T* const* list(Bytes& in, size_t n, Make make) {
    const uint8_t how = in.u8();
    if (how == 255) return nullptr;
    std::vector<const void*>& v = arrays.emplace_back();  // a deque: stays where it is
    for (size_t i = 0; i < n; ++i) v.push_back(in.u8() == 254 ? nullptr : make());
    return n ? reinterpret_cast<const T* const*>(v.data()) : nullptr;
  }
};

template <class F>
F pick(Bytes& in, F f) {
  return in.u8() == 253 ? nullptr : f;
}

const smp_plugin_descriptor* descriptor(Bytes& in, Arena& a) {
  smp_plugin_descriptor d{};
  d.name = a.name(in);
  d.plugin_version = a.name(in);
  const uint8_t major = in.u8();
  d.abi_major = major < 240 ? SMP_ABI_VERSION_MAJOR : major - 240;
  d.abi_minor = in.u8() % 8;
  d.torch_version = in.u8() < 128 ? "" : a.name(in);
  d.n_module_kinds = in.u8() % 5;
  d.module_kinds = a.list<smp_module_kind>(in, d.n_module_kinds, [&] {
    smp_module_kind k{};
    k.name = a.name(in);
    k.create = pick(in, &module_create);
    k.forward = pick(in, &module_forward);
    k.parameters = pick(in, &module_parameters);
    k.destroy = pick(in, &module_destroy);
    k.memory_features = in.u8();
    return a.place(in, k);
  });
  d.n_adapters = in.u8() % 4;
  d.adapters = a.list<smp_model_adapter>(in, d.n_adapters, [&] {
    smp_model_adapter m{};
    m.name = a.name(in);
    m.create = pick(in, &adapter_create);
    m.describe = pick(in, &adapter_describe);
    m.batch = pick(in, &adapter_batch);
    m.destroy = pick(in, &adapter_destroy);
    return a.place(in, m);
  });
  d.n_partitioners = in.u8() % 4;
  d.partitioners = a.list<smp_partition_strategy>(in, d.n_partitioners, [&] {
    smp_partition_strategy p{};
    p.name = a.name(in);
    p.partition = pick(in, &partition);
    return a.place(in, p);
  });
  d.n_rules = in.u8() % 5;
  d.rules = a.list<smp_rule>(in, d.n_rules, [&] {
    smp_rule r{};
    r.axis = a.name(in);
    r.kind = a.name(in);
    r.dist_kind = a.name(in);
    r.check = pick(in, &rule_check);
    r.param_split = in.fraction();
    r.activation_split = in.fraction();
    return a.place(in, r);
  });
  // The extension chain, built back to front; types mostly the known ones.
  const smp_extension_base* chain = nullptr;
  for (int e = in.u8() % 4; e > 0; --e) {
    const uint8_t t = in.u8();
    const uint32_t type = t % 4 == 0 ? SMP_EXTENSION_OPTIMIZERS : t % 4 == 1 ? SMP_EXTENSION_CONFIG
                          : t % 4 == 2 ? SMP_EXTENSION_MEMORY : in.u32();
    const uint32_t version = 1 + in.u8() % 2;
    if (type == SMP_EXTENSION_CONFIG) {
      smp_config_extension c{};
      c.n_tables = in.u8() % 4;
      c.tables = a.list<smp_config_table>(in, c.n_tables, [&] {
        smp_config_table t{};
        t.name = a.name(in);
        t.check = pick(in, &table_check);
        return a.place(in, t);
      });
      c.base = {0, type, version, chain};
      chain = a.place_extension(in, c);
    } else if (type == SMP_EXTENSION_MEMORY) {
      smp_memory_extension m{};
      m.n_kinds = in.u8() % 4;
      m.kinds = a.list<smp_kind_memory>(in, m.n_kinds, [&] {
        smp_kind_memory k{};
        k.kind = a.name(in);
        k.features = in.u8();
        return a.place(in, k);
      });
      m.n_rules = in.u8() % 4;
      m.rules = a.list<smp_rule_memory>(in, m.n_rules, [&] {
        smp_rule_memory r{};
        r.axis = a.name(in);
        r.kind = a.name(in);
        r.param_split = in.fraction();
        r.activation_split = in.fraction();
        return a.place(in, r);
      });
      m.base = {0, type, version, chain};
      chain = a.place_extension(in, m);
    } else {  // the optimizers' layout also stands in for a type the core does not know
      smp_optimizers_extension o{};
      o.n_kinds = in.u8() % 4;
      o.kinds = a.list<smp_optimizer_kind>(in, o.n_kinds, [&] {
        smp_optimizer_kind k{};
        k.name = a.name(in);
        k.create = pick(in, &optimizer_create);
        k.step = pick(in, &optimizer_step);
        k.state_tensors = pick(in, &optimizer_state);
        k.destroy = pick(in, &optimizer_destroy);
        return a.place(in, k);
      });
      o.base = {0, type, version, chain};
      chain = a.place_extension(in, o);
    }
  }
  d.extension_start = chain;
  return in.u8() == 252 ? nullptr : a.place(in, d);
}

}  // namespace

SMP_FUZZ_TARGET(plugin_descriptor) {
  Bytes in(data, size);
  Arena arena;  // outlives the registry, as a loaded library outlives it
  smp::PluginRegistry registry;
  // Up to three plugins into one registry: the later ones meet the names the
  // earlier ones registered.
  for (int i = 0; i < 3 && !in.empty(); ++i) {
    const smp_plugin_descriptor* d = descriptor(in, arena);
    try {
      registry.add("fuzz-" + std::to_string(i), [d](const smp_host_api*, smp_error**) { return d; });
    } catch (const smp::Error& e) {
      smp::fuzz::refused(e.what());
    }
  }
  for (const std::string& kind : registry.module_kinds()) (void)registry.memory_features(kind);
  for (const char* axis : {"tp", "ep", "cp"})
    for (const char* kind : {"linear", "attention", "x"}) (void)registry.memory_split(axis, kind);
  (void)registry.check_tables(nlohmann::json::object(), "fuzz.toml");
}
