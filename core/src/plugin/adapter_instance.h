// The job's model adapter, made from its plugin's table: the graph it
// describes and the batches it serves, in C++ types (the C structs stay in
// plugin/, the one part of the core that speaks the ABI).
#pragma once

#include <smp/mesh.h>
#include <smp/model_graph.h>
#include <smp/plugin_registry.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace smp {

// Which of the adapter's data a batch comes from (smp_split).
enum class DataSplit { Train, Validation };

// A rank's position on one mesh axis that splits data (the batch or the sequence).
struct DataAxis {
  std::string axis;
  AxisRole role = AxisRole::SplitsBatch;
  int index = 0, size = 1;
};

// One microbatch asked of the adapter: samples [first_sample, first_sample +
// num_samples) of `step`'s global batch, for a rank at `axes`.
struct BatchRequest {
  DataSplit split = DataSplit::Train;
  int64_t step = 0, global_batch = 0, first_sample = 0, num_samples = 0;
  std::vector<DataAxis> axes;
};

class AdapterInstance {
 public:
  // Creates adapter `name` (empty: the first loaded plugin's) from the job's
  // [model] and [parallel] tables. Throws naming the adapter, its plugin and
  // `origin` (the job file) when none is loaded or its create fails.
  AdapterInstance(const PluginRegistry& registry, std::string name, const std::string& model_json,
                  const std::string& parallel_json, uint64_t seed, const std::string& origin);
  ~AdapterInstance();
  AdapterInstance(const AdapterInstance&) = delete;
  AdapterInstance& operator=(const AdapterInstance&) = delete;

  // The model the adapter describes, validated.
  ModelGraph describe() const;
  // The request's tensors, one per graph input (`n_inputs`), in input order.
  std::vector<at::Tensor> batch(const BatchRequest& request, size_t n_inputs) const;

  const std::string& name() const { return name_; }
  const std::string& plugin() const { return plugin_; }  // the plugin that provides it

 private:
  struct Handle;
  std::string where() const;
  std::string name_, plugin_;
  std::unique_ptr<Handle> handle_;
};

}  // namespace smp
