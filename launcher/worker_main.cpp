// smp-worker: one rank of a job. smp-launch starts one per rank (or srun/mpirun
// do, through smp-launch); it reads its place in the job from the environment.
#include <smp/config.h>
#include <smp/error.h>
#include <smp/logging.h>
#include <smp/process_env.h>
#include <smp/runtime.h>
#include <smp/training.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <malloc.h>

#include <climits>
#include <cstdlib>
#include <iostream>

// Keep freed activation memory in the heap between steps: glibc's defaults hand
// it back to the kernel after every step and page-fault it in again on the next
// (measured here: 446-480 ms/step with the defaults, 290-308 ms with these; see
// bench/README.md). An explicit MALLOC_* environment variable still wins.
void keep_heap_between_steps() {
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, INT_MAX);
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (!std::getenv("MALLOC_TOP_PAD_")) mallopt(M_TOP_PAD, 256 << 20);
}

int main(int argc, char** argv) {
  keep_heap_between_steps();
  CLI::App app{"smp-worker: one rank of an smp training job (normally started by smp-launch)"};
  std::vector<std::string> plugins, overrides;
  std::string config_path;
  app.add_option("--plugin", plugins, "plugin to load (path or name); the first model adapter found is used")->take_all();
  app.add_option("--config", config_path, "job configuration (TOML)")->required();
  app.add_option("--set", overrides, "override a config key: --set train.steps=5")->take_all();
  CLI11_PARSE(app, argc, argv);

  int rank = 0;
  try {
    smp::ProcessEnv env = smp::ProcessEnv::from_environment();
    rank = env.rank;
    smp::Config config = smp::Config::load(config_path, overrides);
    smp::logging::init(env.rank, env.world_size, config.get_string("run.dir"), config.get_bool("run.log_to_file"),
                       env.rank == 0);
    auto runtime = smp::Runtime::create(config, env, plugins);
    smp::run_training(*runtime);
    runtime->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "smp-worker rank " << rank << ": error: " << e.what() << std::endl;
    spdlog::error("{}", e.what());
    return 1;
  }
}
