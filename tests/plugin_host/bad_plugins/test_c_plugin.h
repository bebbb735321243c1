/* Shared by the pure-C test plugins: a trivial module kind and the export macro.
 * Compiled as C11 with -Wall -Wextra -Wpedantic -Werror: this also proves that
 * smp/abi.h is plain C. */
#ifndef SMP_TEST_C_PLUGIN_H
#define SMP_TEST_C_PLUGIN_H

#include <smp/abi.h>

#include <stdlib.h>

#define SMP_TEST_EXPORT __attribute__((visibility("default")))

/* The plugin owns what smp_module points to. */
struct smp_module {
  int created;
};

static const smp_host_api* test_host = NULL;

static inline smp_error* test_create(void* state, const char* config_json, const smp_module_context* ctx,
                                     smp_module** out) {
  (void)state;
  (void)config_json;
  (void)ctx;
  *out = (smp_module*)calloc(1, sizeof(struct smp_module));
  if (!*out) return test_host->error_create(SMP_ERR_OUT_OF_MEMORY, "test C plugin: out of memory");
  (*out)->created = 1;
  return NULL;
}

static inline smp_error* test_forward(smp_module* module, const smp_forward_args* args) {
  (void)module;
  (void)args;
  return test_host->error_create(SMP_ERR_UNSUPPORTED, "test C plugin: forward not implemented");
}

static inline smp_error* test_parameters(smp_module* module, smp_param_visitor visit, void* user) {
  (void)module;
  (void)visit;
  (void)user;
  return NULL; /* no parameters */
}

static inline void test_destroy(smp_module* module) { free(module); }

/* A complete smp_module_kind named `kind_name`. */
#define SMP_TEST_KIND(kind_name) \
  { SMP_MODULE_KIND_STRUCT_SIZE, kind_name, NULL, test_create, test_forward, test_parameters, test_destroy, 0 }

/* A descriptor with the given versions and module kinds (an array of pointers). */
#define SMP_TEST_DESCRIPTOR(size, plugin_name, major, minor, torch, kinds)                                  \
  {                                                                                                         \
    .struct_size = (size), .name = (plugin_name), .plugin_version = "0.0.1", .abi_major = (major),          \
    .abi_minor = (minor), .torch_version = (torch), .module_kinds = (kinds),                                \
    .n_module_kinds = sizeof(kinds) / sizeof((kinds)[0]), .adapters = NULL, .n_adapters = 0,                \
    .partitioners = NULL, .n_partitioners = 0, .rules = NULL, .n_rules = 0, .extension_start = NULL         \
  }

#define SMP_TEST_FULL_SIZE SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE

/* Defines the entry point returning `descriptor` to a host of the same ABI major. */
#define SMP_TEST_ENTRY(descriptor)                                                                 \
  SMP_TEST_EXPORT const smp_plugin_descriptor* smp_plugin_entry(const smp_host_api* host,          \
                                                                smp_error** error);                \
  SMP_TEST_EXPORT const smp_plugin_descriptor* smp_plugin_entry(const smp_host_api* host,          \
                                                                smp_error** error) {               \
    if (error) *error = NULL;                                                                      \
    if (!host || host->abi_major != SMP_ABI_VERSION_MAJOR) return NULL;                            \
    test_host = host;                                                                              \
    return &(descriptor);                                                                          \
  }

#endif /* SMP_TEST_C_PLUGIN_H */
