// Where a step's microbatches come from: the adapter's batches (by step and
// global sample index) or a batch of the program's own tensors. The executor
// asks one of them for the graph inputs of each microbatch.
#pragma once

#include <smp/batch.h>
#include <smp/mesh.h>

#include "plugin/adapter_instance.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace smp {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // The graph inputs of microbatch `mb` of `step`, in graph-input order (an
  // input the source lacks is an undefined tensor).
  virtual std::vector<at::Tensor> microbatch(DataSplit split, int64_t step, int mb) const = 0;
};

// The adapter's batches: each data-parallel rank reads its own share of the
// global batch, addressed by (split, step, global sample index), so the data
// does not depend on the layout.
class AdapterData final : public DataSource {
 public:
  AdapterData(const AdapterInstance& adapter, const DeviceMesh& mesh, size_t n_inputs, int64_t global_batch,
              int microbatches)
      : adapter_(adapter), mesh_(mesh), n_inputs_(n_inputs), global_batch_(global_batch), microbatches_(microbatches) {}
  std::vector<at::Tensor> microbatch(DataSplit split, int64_t step, int mb) const override;

 private:
  const AdapterInstance& adapter_;
  const DeviceMesh& mesh_;
  size_t n_inputs_;
  int64_t global_batch_;
  int microbatches_;
};

// What a program batch's inputs must look like once one has been seen (the
// example given to create, or the first batch): dtype and dimensions per input.
struct InputSpec {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  int64_t ndim = 0;
};

// A batch of the program's tensors, checked and cut into microbatches along
// dimension 0 (views, no copies), evenly or, for forward, unevenly.
class ProgramBatch final : public DataSource {
 public:
  struct Rules {
    int microbatches = 1;
    int64_t rows = -1;           // the rows it must have; -1: any positive multiple of microbatches
    bool allow_missing = false;  // forward only: inputs may be left out
    // Forward only: any rows >= microbatches, cut like torch.tensor_split (and
    // torch.distributed.pipelining): sizes differ by at most one, the larger first.
    bool uneven = false;
    const std::vector<InputSpec>* spec = nullptr;  // dtypes and ranks to match (null: none yet)
    c10::Device device = c10::Device(c10::kCPU);   // the rank's device (CPU tensors are moved there)
    std::string where;           // "rank 3: train_step" for messages
  };
  // Throws smp::Error naming the input and `rules.where` for an input the
  // graph lacks, a missing one, an undefined or 0-d tensor, a row count that
  // is not `rows` (or not a multiple of microbatches; under `uneven`, fewer
  // than microbatches), rows that differ between inputs, another device, or a
  // dtype / rank other than the spec's.
  ProgramBatch(const Batch& batch, const std::vector<std::string>& graph_inputs, const Rules& rules);
  std::vector<at::Tensor> microbatch(DataSplit split, int64_t step, int mb) const override;
  // The inputs' dtypes and ranks (for the spec later batches must match).
  std::vector<InputSpec> spec() const;

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> inputs_;  // graph-input order; undefined where missing
  int microbatches_ = 1;
  int64_t rows_ = 0;
};

// Microbatch `mb` of `rows` samples cut into `microbatches` (torch.tensor_split's
// sizes): its first sample and its number of samples.
std::pair<int64_t, int64_t> microbatch_rows(int64_t rows, int microbatches, int mb);

}  // namespace smp
