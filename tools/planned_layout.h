// The layout smp-launch runs when a job leaves it to the planner: --plan
// CLUSTER, or parallel.layout = "auto" with parallel.cluster in the job. It
// asks the planner (plan/, <smp/plan.h>) in process for the job, as smp-plan
// --config ranks it, and returns the --set lines of the layout predicted
// fastest; the search is deterministic, so every node picks the same.
#pragma once

#include <string>
#include <vector>

namespace smp::launch {

// The cluster a job plans for through parallel.layout = "auto" (from its
// --set lines, else its --config file), or "" when its layout is not "auto".
// Throws std::runtime_error naming the file and key when the layout is "auto"
// without parallel.cluster, or when the file itself sets a key the plan sets.
std::string auto_layout_cluster(const std::vector<std::string>& worker_args);

// The --set lines of the layout the planner predicts fastest for the job in
// `worker_args` (--plugin, --config, --set) on `world` ranks of `cluster`;
// refuses a job whose --set lines give one of those keys (it would be
// ignored). Prints what it chose. `why`: how the plan was asked for, for messages.
std::vector<std::string> planned_layout(const std::string& cluster, int world,
                                        const std::vector<std::string>& worker_args, const std::string& why);

// An elastic job (--nnodes MIN:MAX) re-forms from its checkpoints: refuses,
// naming the key, one that writes none, and a malformed [elastic.layouts].
void check_elastic_job(const std::vector<std::string>& worker_args);

// The --set lines of an elastic job's layout on `world` ranks: its
// [elastic.layouts] entry for that world; else, with parallel.layout =
// "auto", the plan for parallel.cluster (refused when no layout fits its
// memory); else none (the job's own layout, parallel.dp derived from the
// world). Refuses a world the job's list lacks, naming the file and the sizes
// it lists. Every node computes the same answer.
std::vector<std::string> elastic_layout(int world, const std::vector<std::string>& worker_args);

// What every node of an elastic job must agree on, as a digest: the plugin's
// file name, the --set lines and the job file's text. The rendezvous refuses
// a node whose job differs (each node chooses its layouts from its own).
std::string job_digest(const std::vector<std::string>& worker_args);

}  // namespace smp::launch
