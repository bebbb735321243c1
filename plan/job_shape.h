// The planner's Shape of a job: read from the graph its adapter describes
// (Runtime::describe_model), so that smp-plan --config, parallel.layout =
// "auto" and the planner's benchmark see the model smp would build.
#pragma once

#include "plan/step_model.h"

#include <smp/config.h>

#include <string>

namespace smp::plan {

// Transformer layers (the gpt adapter's transformer_layer nodes; the moe
// adapter's attention nodes, each followed by an MLP or a moe node), their
// hidden size, heads, kv heads, MLP width and kind (SwiGLU's three GEMMs or
// two), the experts of the moe nodes, the embedding's rows (the padded
// vocabulary) and tokens per sample; train.batch_size and train.precision.
// Throws smp::Error naming the job file when the graph is not a decoder of
// that shape.
Shape shape_of_job(const Config& config, int world, const std::string& plugin);

}  // namespace smp::plan
