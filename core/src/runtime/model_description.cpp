// What a job's model and layout would be without joining a job: the memory
// estimate (smp-launch --estimate-memory) and the model's description
// (smp-plan): a ModelPlan, or its ModelDefinition only. No
// rendezvous, no module is created.
#include <smp/runtime.h>

#include <smp/job_config.h>

#include "memory/memory_model.h"
#include "runtime/model_plan.h"
#include "runtime/parallel_context.h"

#include <algorithm>

namespace smp {

nlohmann::json Runtime::estimate_memory(Config config, int world_size, const std::vector<PluginSource>& plugins) {
  config.resolve_layout(world_size);
  const JobConfig job = JobConfig::from(config);
  const auto context = ParallelContext::offline(job, world_size);
  const ModelPlan model(std::make_unique<const ModelDefinition>(job, context->mesh(), plugins), job, context->mesh(),
                        nullptr);
  const MemoryModelOptions o = model.memory_options();
  nlohmann::json ranks = nlohmann::json::array();
  double worst = 0;
  for (const RankMemory& m : smp::estimate_memory(model.graph(), model.stage_plan(), model.schedule(), o)) {
    ranks.push_back(to_json(m));
    worst = std::max(worst, m.total());
  }
  const ParallelConfig& par = job.parallel;
  nlohmann::json out;
  out["layout"] = {{"pp", par.pp}, {"tp", par.tp}, {"dp", par.dp}, {"world", world_size},
                   {"microbatches", par.microbatches}, {"schedule", par.schedule}};
  out["memory"] = {{"zero", job.memory.zero},
                   {"checkpointed_nodes", std::count(o.checkpoint.begin(), o.checkpoint.end(), true)},
                   {"precision", to_string(job.train.precision)}};
  out["per_pp_rank"] = ranks;
  out["max_total_bytes"] = worst;
  return out;
}

nlohmann::json Runtime::describe_model(Config config, int world_size, const std::vector<PluginSource>& plugins) {
  config.resolve_layout(world_size);
  const JobConfig job = JobConfig::from(config);
  const auto context = ParallelContext::offline(job, world_size);
  const ModelDefinition model(job, context->mesh(), plugins);
  nlohmann::json nodes = nlohmann::json::array();
  for (const GraphNode& n : model.graph().nodes)
    nodes.push_back({{"name", n.name}, {"kind", n.kind}, {"config", nlohmann::json::parse(n.config_json)}});
  return {{"nodes", nodes},
          {"throughput_unit", model.graph().throughput_unit},
          {"throughput_per_sample", model.graph().throughput_per_sample}};
}

}  // namespace smp
