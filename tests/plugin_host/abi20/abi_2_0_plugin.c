/* A plugin as one built against ABI 2.0 looks to this core: pure C11, its
 * descriptor says abi_minor 0, and every struct it hands to the host carries
 * the 2.0 size (SMP_*_STRUCT_SIZE_2_0 for the structs that grew since; the
 * descriptor has not grown, so its size is SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE).
 *
 * It provides one real module kind, "abi20_scale": a weight of 4 floats
 * {0.5, 1, 1.5, 2} (created through the host table from DLPack: a C plugin has
 * no LibTorch), and forward(x) = x * weight over x's last dimension, computed
 * in C over the tensors' memory into a new tensor handed over by DLPack. The
 * host table has no tensor operations, so that output is not connected to
 * autograd: the weight receives no gradient from it. And one "tp" rule for the
 * kind (to itself), of the 2.0 size.
 *
 * The fields later minors appended lie past the struct_size given, where a
 * real 2.0 plugin has whatever comes next in its memory. Here they hold
 * poison that a host reading them would trip over visibly: memory_features
 * with every bit set, the rule's splits 0 (a host reading them would split
 * nothing instead of everything), and smp_param_info.init pointing at an
 * initialiser with struct_size 0 (which the host refuses, naming it). */
#include <smp/abi.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ABI20_EXPORT __attribute__((visibility("default")))

/* The sizes a writer of minor 0 fills. */
#define ABI20_DESCRIPTOR_SIZE SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE /* unchanged since 2.0 */
#define ABI20_MODULE_KIND_SIZE SMP_MODULE_KIND_STRUCT_SIZE_2_0
#define ABI20_RULE_SIZE SMP_RULE_STRUCT_SIZE_2_0
#define ABI20_PARAM_INFO_SIZE SMP_PARAM_INFO_STRUCT_SIZE_2_0

_Static_assert(ABI20_MODULE_KIND_SIZE < SMP_MODULE_KIND_STRUCT_SIZE, "smp_module_kind grew in 2.1");
_Static_assert(ABI20_RULE_SIZE < SMP_RULE_STRUCT_SIZE, "smp_rule grew in 2.1");
_Static_assert(ABI20_PARAM_INFO_SIZE < SMP_PARAM_INFO_STRUCT_SIZE, "smp_param_info grew in 2.2");

/* DLPack 0.6 (dlpack.h; ATen/dlpack.h in LibTorch). abi.h only forward-declares
 * struct DLManagedTensor; a C plugin brings the (stable) layout itself. */
typedef struct {
  int32_t device_type; /* DLDeviceType: kDLCPU = 1 */
  int32_t device_id;
} abi20_dl_device;
typedef struct {
  uint8_t code; /* DLDataTypeCode: kDLFloat = 2 */
  uint8_t bits;
  uint16_t lanes;
} abi20_dl_dtype;
typedef struct {
  void* data;
  abi20_dl_device device;
  int ndim;
  abi20_dl_dtype dtype;
  int64_t* shape;
  int64_t* strides; /* in elements */
  uint64_t byte_offset;
} abi20_dl_tensor;
struct DLManagedTensor {
  abi20_dl_tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(struct DLManagedTensor* self);
};

#define ABI20_WIDTH 4

static const smp_host_api* host = NULL;

static smp_error* fail(smp_error_code code, const char* message) { return host->error_create(code, message); }

/* A new contiguous float32 CPU tensor of the given shape, its memory allocated
 * here and freed through the DLPack deleter when the host lets go of it; *data
 * is its memory. */
typedef struct {
  struct DLManagedTensor managed;
  int64_t shape[8];
  int64_t strides[8];
} abi20_buffer;

static void abi20_free(struct DLManagedTensor* self) {
  abi20_buffer* b = (abi20_buffer*)self->manager_ctx;
  free(self->dl_tensor.data);
  free(b);
}

static smp_error* new_tensor(const int64_t* shape, int ndim, float** data, smp_tensor** out) {
  size_t numel = 1;
  int64_t stride;
  int i;
  abi20_buffer* b;
  if (ndim < 0 || ndim > 8) return fail(SMP_ERR_INVALID_ARGUMENT, "abi20_scale: at most 8 dimensions");
  for (i = 0; i < ndim; ++i) numel *= (size_t)shape[i];
  b = (abi20_buffer*)calloc(1, sizeof(abi20_buffer));
  if (!b) return fail(SMP_ERR_OUT_OF_MEMORY, "abi20_scale: out of memory");
  *data = (float*)malloc((numel ? numel : 1) * sizeof(float));
  if (!*data) {
    free(b);
    return fail(SMP_ERR_OUT_OF_MEMORY, "abi20_scale: out of memory");
  }
  for (i = ndim - 1, stride = 1; i >= 0; --i) {
    b->shape[i] = shape[i];
    b->strides[i] = stride;
    stride *= shape[i];
  }
  b->managed.dl_tensor.data = *data;
  b->managed.dl_tensor.device.device_type = 1; /* kDLCPU */
  b->managed.dl_tensor.device.device_id = 0;
  b->managed.dl_tensor.ndim = ndim;
  b->managed.dl_tensor.dtype.code = 2; /* kDLFloat */
  b->managed.dl_tensor.dtype.bits = 32;
  b->managed.dl_tensor.dtype.lanes = 1;
  b->managed.dl_tensor.shape = b->shape;
  b->managed.dl_tensor.strides = b->strides;
  b->managed.dl_tensor.byte_offset = 0;
  b->managed.manager_ctx = b;
  b->managed.deleter = abi20_free;
  /* The host takes ownership of the DLManagedTensor, on failure too. */
  return host->tensor_from_dlpack(&b->managed, out);
}

/* The plugin owns what smp_module points to. */
struct smp_module {
  smp_tensor* weight; /* one reference */
};

static smp_error* abi20_create(void* state, const char* config_json, const smp_module_context* ctx,
                               smp_module** out) {
  const int64_t shape[1] = {ABI20_WIDTH};
  float* w = NULL;
  smp_error* err;
  int i;
  (void)state;
  (void)config_json; /* reads nothing */
  *out = NULL;
  if (ctx->device_type != SMP_DEVICE_CPU) return fail(SMP_ERR_UNSUPPORTED, "abi20_scale: CPU only");
  *out = (smp_module*)calloc(1, sizeof(struct smp_module));
  if (!*out) return fail(SMP_ERR_OUT_OF_MEMORY, "abi20_scale: out of memory");
  err = new_tensor(shape, 1, &w, &(*out)->weight);
  if (err) {
    free(*out);
    *out = NULL;
    return err;
  }
  for (i = 0; i < ABI20_WIDTH; ++i) w[i] = 0.5f * (float)(i + 1);
  return NULL;
}

/* out = x * weight, the weight broadcast over x's last dimension. */
static smp_error* abi20_forward(smp_module* module, const smp_forward_args* args) {
  smp_tensor* x;
  const int64_t *sizes, *strides;
  int64_t ndim, expect, d;
  size_t numel = 1, i;
  const float *in, *w;
  float* out_data = NULL;
  smp_device_type type;
  smp_error* err;
  if (args->method && strcmp(args->method, "forward") != 0)
    return fail(SMP_ERR_NOT_FOUND, "abi20_scale: no such method");
  if (args->n_inputs != 1 || args->n_outputs != 1)
    return fail(SMP_ERR_INVALID_ARGUMENT, "abi20_scale: takes one input and gives one output");
  x = args->inputs[0];
  ndim = host->tensor_ndim(x);
  sizes = host->tensor_sizes(x);
  strides = host->tensor_strides(x);
  host->tensor_device(x, &type, NULL);
  if (host->tensor_dtype(x) != SMP_DTYPE_FLOAT32 || type != SMP_DEVICE_CPU)
    return fail(SMP_ERR_INVALID_ARGUMENT, "abi20_scale: the input must be a float32 CPU tensor");
  if (ndim < 1 || ndim > 8 || sizes[ndim - 1] != ABI20_WIDTH)
    return fail(SMP_ERR_INVALID_ARGUMENT, "abi20_scale: the input's last dimension must be 4");
  for (d = ndim - 1, expect = 1; d >= 0; --d) {
    if (sizes[d] != 1 && strides[d] != expect)
      return fail(SMP_ERR_INVALID_ARGUMENT, "abi20_scale: the input must be contiguous");
    expect *= sizes[d];
    numel *= (size_t)sizes[d];
  }
  err = new_tensor(sizes, (int)ndim, &out_data, &args->outputs[0]);
  if (err) return err;
  in = (const float*)host->tensor_data(x);
  w = (const float*)host->tensor_data(module->weight);
  for (i = 0; i < numel; ++i) out_data[i] = in[i] * w[i % ABI20_WIDTH];
  return NULL;
}

/* Poison past struct_size (see the top): a host reading init would refuse it. */
static const smp_param_init poisoned_init = {0};

static smp_error* abi20_parameters(smp_module* module, smp_param_visitor visit, void* user) {
  smp_param_info info;
  memset(&info, 0, sizeof info);
  info.struct_size = ABI20_PARAM_INFO_SIZE;
  info.name = "weight";
  info.tensor = module->weight;
  info.placements = NULL; /* replicated on every axis */
  info.n_placements = 0;
  info.init = &poisoned_init; /* past struct_size */
  visit(user, &info);
  return NULL;
}

static void abi20_destroy(smp_module* module) {
  if (!module) return;
  if (module->weight) host->tensor_release(module->weight);
  free(module);
}

static const smp_module_kind scale_kind = {
    .struct_size = ABI20_MODULE_KIND_SIZE,
    .name = "abi20_scale",
    .state = NULL,
    .create = abi20_create,
    .forward = abi20_forward,
    .parameters = abi20_parameters,
    .destroy = abi20_destroy,
    .memory_features = 0xffffffffu, /* past struct_size: poison */
};
static const smp_module_kind* const kinds[] = {&scale_kind};

static const smp_rule scale_rule = {
    .struct_size = ABI20_RULE_SIZE,
    .axis = "tp",
    .kind = "abi20_scale",
    .dist_kind = "abi20_scale",
    .state = NULL,
    .check = NULL,
    .param_split = 0.0, /* past struct_size: poison */
    .activation_split = 0.0,
};
static const smp_rule* const rules[] = {&scale_rule};

static const smp_plugin_descriptor descriptor = {
    .struct_size = ABI20_DESCRIPTOR_SIZE,
    .name = "abi_2_0_plugin",
    .plugin_version = "2.0.0",
    .abi_major = 2,
    .abi_minor = 0,
    .torch_version = "",
    .module_kinds = kinds,
    .n_module_kinds = 1,
    .adapters = NULL,
    .n_adapters = 0,
    .partitioners = NULL,
    .n_partitioners = 0,
    .rules = rules,
    .n_rules = 1,
    .extension_start = NULL,
};

ABI20_EXPORT const smp_plugin_descriptor* smp_plugin_entry(const smp_host_api* h, smp_error** error);
ABI20_EXPORT const smp_plugin_descriptor* smp_plugin_entry(const smp_host_api* h, smp_error** error) {
  if (error) *error = NULL;
  if (h && h->abi_major == 2) host = h; /* another major: the table untouched, the host names us */
  return &descriptor;
}
