#include "runtime/data_source.h"

#include <smp/error.h>

#include <ATen/ATen.h>

#include <algorithm>

namespace smp {

std::vector<at::Tensor> AdapterData::microbatch(DataSplit split, int64_t step, int mb) const {
  const int64_t per_dp = global_batch_ / mesh_.size(Role::Batch);
  const int64_t per_mb = per_dp / microbatches_;
  BatchRequest req;
  req.split = split;
  req.step = step;
  req.global_batch = global_batch_;
  req.first_sample = mesh_.coord(Role::Batch) * per_dp + mb * per_mb;
  req.num_samples = per_mb;
  // The rank's coordinates on every dimension that splits data.
  for (const Axis& a : mesh_.axes()) {
    const AxisRole role = mesh_.role(a);
    if (role == AxisRole::SplitsBatch || role == AxisRole::SplitsSequence)
      req.axes.push_back({a.name(), role, mesh_.coord(a), mesh_.size(a)});
  }
  return adapter_.batch(req, n_inputs_);
}

namespace {

std::string listed(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}

}  // namespace

ProgramBatch::ProgramBatch(const Batch& batch, const std::vector<std::string>& graph_inputs, const Rules& rules)
    : names_(graph_inputs), inputs_(graph_inputs.size()), microbatches_(rules.microbatches) {
  const std::string& where = rules.where;
  for (const auto& [name, tensor] : batch)
    if (std::find(graph_inputs.begin(), graph_inputs.end(), name) == graph_inputs.end())
      throw Error(where + ": batch input '" + name + "' is not an input of the graph (inputs: " +
                  listed(graph_inputs) + ")");
  rows_ = -1;
  std::string first;
  for (size_t i = 0; i < graph_inputs.size(); ++i) {
    const std::string& name = graph_inputs[i];
    auto it = batch.find(name);
    if (it == batch.end()) {
      if (rules.allow_missing) continue;
      throw Error(where + ": the batch lacks graph input '" + name + "' (inputs: " + listed(graph_inputs) + ")");
    }
    const at::Tensor& t = it->second;
    const std::string what = where + ": batch input '" + name + "'";
    if (!t.defined()) throw Error(what + " is an undefined tensor");
    if (t.dim() == 0) throw Error(what + " is 0-d: samples go along dimension 0");
    if (!t.device().is_cpu() && t.device() != rules.device)
      throw Error(what + " is on " + t.device().str() + "; this rank computes on " + rules.device.str() +
                  " (pass CPU tensors or tensors on that device)");
    if (rules.spec) {
      for (const InputSpec& s : *rules.spec)
        if (s.name == name && (s.dtype != t.scalar_type() || s.ndim != t.dim()))
          throw Error(what + " is " + std::string(c10::toString(t.scalar_type())) + " with " +
                      std::to_string(t.dim()) + " dimensions; the model was planned for " +
                      c10::toString(s.dtype) + " with " + std::to_string(s.ndim) + " (the first batch's)");
    }
    if (rows_ < 0) {
      rows_ = t.size(0);
      first = name;
    } else if (t.size(0) != rows_) {
      throw Error(what + " has " + std::to_string(t.size(0)) + " samples (dimension 0), input '" + first + "' has " +
                  std::to_string(rows_));
    }
    inputs_[i] = t;
  }
  if (rows_ < 0) throw Error(where + ": the batch holds no graph input (inputs: " + listed(graph_inputs) + ")");
  if (rules.rows >= 0 && rows_ != rules.rows)
    throw Error(where + ": the batch has " + std::to_string(rows_) + " samples; this rank's share of the global batch "
                "is " + std::to_string(rules.rows) + " (train.batch_size / parallel.dp; or pass the whole global batch)");
  if (rules.uneven && rows_ < microbatches_)
    throw Error(where + ": the batch's " + std::to_string(rows_) + " samples are fewer than parallel.microbatches = " +
                std::to_string(microbatches_) + " (each microbatch needs at least one)");
  if (!rules.uneven && (rows_ == 0 || rows_ % microbatches_ != 0))
    throw Error(where + ": the batch's " + std::to_string(rows_) + " samples do not split into parallel.microbatches = " +
                std::to_string(microbatches_) + " equal microbatches");
}

std::pair<int64_t, int64_t> microbatch_rows(int64_t rows, int microbatches, int mb) {
  const int64_t per = rows / microbatches, extra = rows % microbatches;
  return {mb * per + std::min<int64_t>(mb, extra), per + (mb < extra ? 1 : 0)};
}

std::vector<at::Tensor> ProgramBatch::microbatch(DataSplit, int64_t, int mb) const {
  const auto [first, count] = microbatch_rows(rows_, microbatches_, mb);
  std::vector<at::Tensor> out(inputs_.size());
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (inputs_[i].defined()) out[i] = inputs_[i].narrow(0, first, count);
  return out;
}

std::vector<InputSpec> ProgramBatch::spec() const {
  std::vector<InputSpec> out;
  for (size_t i = 0; i < inputs_.size(); ++i)
    if (inputs_[i].defined()) out.push_back({names_[i], inputs_[i].scalar_type(), inputs_[i].dim()});
  return out;
}

}  // namespace smp
