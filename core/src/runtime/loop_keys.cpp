#include "runtime/loop_keys.h"

#include <smp/error.h>

#include <string>

namespace smp {

void refuse_loop_only_keys(const Config& config, const JobConfig& job) {
  const RunConfig& run = job.run;
  auto refuse = [&](const std::string& key, const std::string& instead) {
    throw Error(config.origin_of(key) + ": " + key + " is acted on only by the training loop (smp::run_training, "
                "which smp-worker runs); this program drives the Runtime itself: " + instead);
  };
  if (run.trace) refuse("run.trace", "record with smp/tracing.h and write the files yourself, or leave it unset");
  if (run.profile_ops) refuse("run.profile_ops", "leave it unset, or run the job through smp-worker");
  if (run.dump_parameters) refuse("run.dump_parameters", "read runtime->gather_parameters() instead");
  if (run.exit_after_steps > 0) refuse("run.exit_after_steps", "stop your loop when you want");
  if (run.hang_timeout_s > 0) refuse("run.hang_timeout_s", "it needs the loop's heartbeat; leave it unset");
}

}  // namespace smp
