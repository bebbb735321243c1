// C++ model adapters over the ABI: derive from Adapter, register with PluginBuilder::adapter<T>.
#pragma once

#include <smp/sdk/module.hpp>
#include <smp/sdk/sequence.hpp>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace smp::sdk {

// Builds the model graph (wraps smp_graph_builder).
class GraphBuilder {
 public:
  explicit GraphBuilder(smp_graph_builder* b) : b_(b) {}

  void input(const std::string& value) { check(host().graph_add_input(b_, value.c_str())); }

  struct Node {
    std::string name, kind;
    Json config = Json::object();
    std::vector<std::string> inputs, outputs;
    std::string method;      // empty = forward
    std::string shared_key;  // empty = none
    double flops = 0, param_bytes = 0, activation_bytes = 0;  // per sample, 0 = unknown
    // For the memory model (smp_graph_node's, ABI 2.2): bytes kept in addition
    // under 16-bit precision, and the part of activation_bytes an attention core keeps.
    double activation_fp32_extra_bytes = 0, attention_core_bytes = 0;
  };
  void node(const Node& n) {
    std::string cfg = n.config.dump();
    std::vector<const char*> in, out;
    for (auto& s : n.inputs) in.push_back(s.c_str());
    for (auto& s : n.outputs) out.push_back(s.c_str());
    smp_graph_node g{};
    g.struct_size = SMP_GRAPH_NODE_STRUCT_SIZE;
    g.name = n.name.c_str();
    g.kind = n.kind.c_str();
    g.config_json = cfg.c_str();
    g.method = n.method.empty() ? nullptr : n.method.c_str();
    g.inputs = in.data();
    g.n_inputs = in.size();
    g.outputs = out.data();
    g.n_outputs = out.size();
    g.shared_key = n.shared_key.empty() ? nullptr : n.shared_key.c_str();
    g.flops_hint = n.flops;
    g.param_bytes_hint = n.param_bytes;
    g.activation_bytes_hint = n.activation_bytes;
    g.activation_fp32_extra_bytes_hint = n.activation_fp32_extra_bytes;
    g.attention_core_bytes_hint = n.attention_core_bytes;
    check(host().graph_add_node(b_, &g));
  }
  // The loss is a mean over the microbatch's samples.
  void loss(const std::string& value) { check(host().graph_set_loss(b_, value.c_str())); }
  // The loss is a sum over `count`'s items (e.g. tokens not masked), the count
  // a scalar output of any node (ABI 2.2; carried to the last stage). The core
  // divides by the step's total count once.
  void loss_sum(const std::string& sum, const std::string& count) {
    check(host().graph_set_loss_sum(b_, sum.c_str(), count.c_str()));
  }
  void flops_per_sample(double f) { check(host().graph_set_flops_per_sample(b_, f)); }
  // A validation metric: sum / count over every validation batch (ABI 2.2),
  // both scalar outputs of one node, e.g. metric("hr@10", "hits", "users").
  void metric(const std::string& name, const std::string& sum, const std::string& count) {
    if (!SMP_HAS_FIELD(&host(), smp_host_api, graph_add_metric))
      throw Error(SMP_ERR_UNSUPPORTED, "validation metric '" + name + "': this host (ABI 2." +
                                           std::to_string(host().abi_minor) + ") has no graph_add_metric (ABI 2.2)");
    check(host().graph_add_metric(b_, name.c_str(), sum.c_str(), count.c_str()));
  }
  // Throughput is reported in `unit` ("tokens"), `per_sample` of them per sample.
  void throughput_unit(const std::string& unit, double per_sample) {
    check(host().graph_set_throughput_unit(b_, unit.c_str(), per_sample));
  }
  // batch() returns each sample's share of its sequence on a sequence axis
  // (BatchRequest::sequence; ABI 2.8), along dimension `dim` of every input.
  // A job with parallel.cp > 1 refuses an adapter that does not say so.
  void split_sequence(int dim) {
    const auto* ext =
        reinterpret_cast<const smp_graph_extension*>(find_extension(host().extension_start, SMP_EXTENSION_GRAPH));
    // A host before 2.8 has no sequence axes: there is nothing to split.
    if (!ext || ext->base.struct_size < SMP_GRAPH_EXTENSION_STRUCT_SIZE) return;
    check(ext->split_sequence(b_, dim));
  }

 private:
  smp_graph_builder* b_;
};

struct BatchRequest {
  smp_split split = SMP_SPLIT_TRAIN;
  int64_t step = 0;
  int64_t global_batch = 0;
  int64_t first_sample = 0;
  int64_t num_samples = 0;
  // This rank's share of each sample's sequence (ABI 2.8's batch axes): an
  // adapter that declared GraphBuilder::split_sequence returns the tokens at
  // sequence_share_of's positions. Not split (0 of 1) otherwise.
  SequenceShare sequence;

  static BatchRequest from(const smp_batch_request* r) {
    BatchRequest req{r->split, r->step, r->global_batch, r->first_sample, r->num_samples, {}};
    if (!SMP_HAS_FIELD(r, smp_batch_request, extension_start)) return req;
    const auto* ext = reinterpret_cast<const smp_batch_axes_extension*>(
        find_extension(r->extension_start, SMP_EXTENSION_BATCH_AXES));
    if (!ext || ext->base.struct_size < SMP_BATCH_AXES_EXTENSION_STRUCT_SIZE) return req;
    for (size_t i = 0; i < ext->n_axes; ++i) {
      const smp_axis_coord& a = ext->axes[i];
      if (a.struct_size < SMP_AXIS_COORD_STRUCT_SIZE || !(a.flags & SMP_AXIS_SPLITS_SEQUENCE)) continue;
      if (req.sequence.split())
        throw Error("batch request: two sequence axes (\"" + req.sequence.axis + "\", \"" + a.axis + "\")");
      req.sequence = {a.axis ? a.axis : "", a.index, a.size};
    }
    return req;
  }
};

// What an adapter is told when it is created (a C++ view of smp_adapter_context).
struct AdapterContext {
  uint64_t seed = 0;
  Json parallel = Json::object();  // the job's [parallel] table (ABI 2.2; empty from an older host)
  int tp() const { return parallel.value("tp", 1); }
  // The size of a mesh dimension as the job declares it: "pp", "dp", "tp",
  // "ep", "cp" (the sequence axis), or one of parallel.axes; 1 for an axis the
  // job lacks.
  int axis_size(const std::string& axis) const {
    if (axis == "pp" || axis == "dp" || axis == "tp" || axis == "ep" || axis == "cp")
      return parallel.contains(axis) && parallel[axis].is_number_integer() ? parallel[axis].get<int>() : 1;
    const Json axes = parallel.value("axes", Json::object());
    return axes.value(axis, 1);
  }

  static AdapterContext from(const smp_adapter_context* c) {
    AdapterContext a;
    if (!c) return a;
    a.seed = c->seed;
    if (SMP_HAS_FIELD(c, smp_adapter_context, parallel_json) && c->parallel_json && *c->parallel_json)
      a.parallel = Json::parse(c->parallel_json);
    return a;
  }
};

// Megatron's vocabulary padding: the smallest multiple of `multiple` x tp that
// holds `vocab`, so every tp rank's shard of the embedding and of the logits is
// equal and a multiple of `multiple`. The padded classes' logits are masked out
// of the loss (cross_entropy's real_vocab).
inline int64_t padded_vocab(int64_t vocab, int64_t multiple, int tp) {
  const int64_t unit = multiple * tp;
  return (vocab + unit - 1) / unit * unit;
}

// An adapter class T is constructed as T(const Json& model_config, const AdapterContext&),
// or (the older form) T(const Json& model_config, uint64_t seed).
class Adapter {
 public:
  virtual ~Adapter() = default;
  virtual void describe(GraphBuilder& graph) = 0;
  // One tensor per graph input, in the order the inputs were declared.
  virtual std::vector<at::Tensor> batch(const BatchRequest& request) = 0;
};

// Makes an adapter registered with a function (PluginBuilder::adapter(name, factory)).
using AdapterFactory = std::function<std::unique_ptr<Adapter>(const Json& model_config, const AdapterContext& context)>;

namespace detail {
struct AdapterBox {
  Adapter* impl;
};
template <class T>
struct AdapterTable {
  static smp_error* create(void* state, const char* config_json, const smp_adapter_context* ctx, smp_adapter** out) {
    return guard([&] {
      Json cfg = (config_json && *config_json) ? Json::parse(config_json) : Json::object();
      const AdapterContext actx = AdapterContext::from(ctx);
      auto* box = new AdapterBox{nullptr};
      try {
        if constexpr (std::is_abstract_v<T>) {
          auto made = (*static_cast<const AdapterFactory*>(state))(cfg, actx);
          if (!made) throw Error("the adapter factory made no adapter");
          box->impl = made.release();
        } else if constexpr (std::is_constructible_v<T, const Json&, const AdapterContext&>) {
          box->impl = new T(cfg, actx);
        } else {
          box->impl = new T(cfg, actx.seed);
        }
      } catch (...) {
        delete box;
        throw;
      }
      *out = reinterpret_cast<smp_adapter*>(box);
    });
  }
  static smp_error* describe(smp_adapter* a, smp_graph_builder* b) {
    return guard([&] {
      GraphBuilder g(b);
      reinterpret_cast<AdapterBox*>(a)->impl->describe(g);
    });
  }
  static smp_error* batch(smp_adapter* a, const smp_batch_request* r, smp_tensor** outputs, size_t n) {
    return guard([&] {
      const BatchRequest req = BatchRequest::from(r);
      auto ts = reinterpret_cast<AdapterBox*>(a)->impl->batch(req);
      if (ts.size() != n)
        throw Error("batch produced " + std::to_string(ts.size()) + " tensors, the graph declares " +
                    std::to_string(n) + " inputs");
      for (size_t i = 0; i < n; ++i) outputs[i] = to_handle(ts[i]);
    });
  }
  static void destroy(smp_adapter* a) {
    auto* box = reinterpret_cast<AdapterBox*>(a);
    delete box->impl;
    delete box;
  }
};
}  // namespace detail

}  // namespace smp::sdk
