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

#include <map>
#include <nlohmann/json.hpp>

#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <iostream>

// Keep freed activation memory in the heap between steps: glibc's defaults hand
// it back to the kernel after every step and page-fault it in again on the next
// (bench/results/gpt-default-malloc.json measures the difference; see
// bench/README.md, "Allocator"). An explicit MALLOC_* environment variable still wins.
void keep_heap_between_steps() {
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, INT_MAX);
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 32 << 20);
  if (!std::getenv("MALLOC_TOP_PAD_")) mallopt(M_TOP_PAD, 256 << 20);
}

// "80GB", "141GiB", "512MB", "1e9": bytes; KB/MB/GB/TB are taken as binary
// (KiB...), as GPU memory sizes are ("80GB" A100 = 80 GiB). Throws naming the flag.
double parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw smp::Error("--device-memory: expected a size like 80GB, got '" + text + "'");
  }
  std::string unit = text.substr(used);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() == 3 && unit[1] == 'I') unit.erase(1, 1);  // GiB -> GB
  const std::map<std::string, double> scale = {{"", 1}, {"B", 1}, {"KB", 1024.0}, {"MB", 1024.0 * 1024},
                                               {"GB", 1024.0 * 1024 * 1024}, {"TB", 1024.0 * 1024 * 1024 * 1024}};
  auto it = scale.find(unit);
  // At most a petabyte: 1e300GB became infinite bytes and "fits".
  if (it == scale.end() || !(v > 0) || !std::isfinite(v) || v * it->second > 1e15)
    throw smp::Error("--device-memory: expected a size like 80GB, got '" + text + "' (at most 1 PB)");
  return v * it->second;
}

// smp-launch --estimate-memory: one process, no rendezvous, nothing allocated at full size.
int estimate(const std::string& config_path, const std::vector<std::string>& overrides,
             const std::vector<std::string>& plugins, int world_size, const std::string& device_memory) {
  smp::Config config = smp::Config::load(config_path, overrides);
  if (world_size <= 0) {
    // Without a world size, the layout's own: pp * tp * dp * the job's axes (dp must then be given).
    if (!config.has("parallel.dp"))
      throw smp::Error(config_path + ": parallel.dp: --estimate-memory needs the layout's dp (or --nproc-per-node)");
    int64_t world = config.get_int("parallel.pp") * config.get_int("parallel.tp") * config.get_int("parallel.dp");
    for (const auto& [name, size] : config.section_json("parallel")["axes"].items()) world *= size.get<int64_t>();
    world_size = static_cast<int>(world);
  }
  nlohmann::json e = smp::Runtime::estimate_memory(config, world_size, {plugins.begin(), plugins.end()});
  const double limit = device_memory.empty() ? 0 : parse_bytes(device_memory);
  auto gib = [](double b) { return b / (1024.0 * 1024 * 1024); };
  std::printf("memory estimate: pp=%d tp=%d dp=%d (world %d), %d microbatches, %s, zero %d, %s, %d checkpointed nodes\n",
              e["layout"]["pp"].get<int>(), e["layout"]["tp"].get<int>(), e["layout"]["dp"].get<int>(), world_size,
              e["layout"]["microbatches"].get<int>(), e["layout"]["schedule"].get<std::string>().c_str(),
              e["memory"]["zero"].get<int>(), e["memory"]["precision"].get<std::string>().c_str(),
              e["memory"]["checkpointed_nodes"].get<int>());
  std::printf("%8s %12s %12s %12s %12s %12s  (GiB per rank)\n", "pp rank", "parameters", "gradients", "optimizer",
              "step peak", "total");
  for (const auto& r : e["per_pp_rank"])
    std::printf("%8d %12.3f %12.3f %12.3f %12.3f %12.3f\n", r["pp_rank"].get<int>(), gib(r["parameters"].get<double>()),
                gib(r["gradients"].get<double>()), gib(r["optimizer_state"].get<double>()),
                gib(r["step_peak"].get<double>()), gib(r["total"].get<double>()));
  const double worst = e["max_total_bytes"].get<double>();
  bool fits = true;
  if (limit > 0) {
    fits = worst <= limit;
    e["device_memory_bytes"] = limit;
    e["fits"] = fits;
    std::printf("largest rank: %.3f GiB of %.3f GiB device memory: %s\n", gib(worst), gib(limit),
                fits ? "fits" : "DOES NOT FIT");
  }
  std::printf("%s\n", e.dump().c_str());
  return fits ? 0 : 2;
}

int main(int argc, char** argv) {
  keep_heap_between_steps();
  CLI::App app{"smp-worker: one rank of an smp training job (normally started by smp-launch)"};
  std::vector<std::string> plugins, overrides;
  std::string config_path;
  app.add_option("--plugin", plugins, "plugin to load (path or name); the first model adapter found is used")->take_all();
  app.add_option("--config", config_path, "job configuration (TOML)")->required();
  app.add_option("--set", overrides, "override a config key: --set train.steps=5")->take_all();
  bool estimate_only = false;
  int world_size = 0;
  std::string device_memory;
  app.add_flag("--estimate-memory", estimate_only,
               "print the per-rank memory estimate for the configured layout and exit (no training; exit 2 when it "
               "does not fit --device-memory)");
  app.add_option("--world-size", world_size, "with --estimate-memory: ranks in the job (default pp * tp * dp)");
  app.add_option("--device-memory", device_memory, "with --estimate-memory: memory per device, e.g. 80GB");
  bool trace = false;
  app.add_flag("--trace", trace,
               "write a timeline trace of run.trace_steps per rank to <run.dir>/trace/ (the same as --set run.trace=true)");
  std::string resume;
  auto* resume_opt = app.add_option("--resume", resume,
                                    "continue from a checkpoint: without a value the newest in run.checkpoint_dir "
                                    "(an error when there is none), else the checkpoint folder given "
                                    "(the same as --set run.resume=...)")
                         ->expected(0, 1);
  // Runs while parsing, before --config is required: the reference needs no job.
  app.add_flag_callback(
      "--config-reference",
      [] {
        std::cout << smp::Config::reference();
        std::exit(0);
      },
      "print every job configuration key (type, default, accepted values, meaning) as markdown and exit");
  CLI11_PARSE(app, argc, argv);
  if (trace) overrides.insert(overrides.begin(), "run.trace=true");  // a later --set still decides
  if (resume_opt->count() > 0) {
    std::string quoted;  // a TOML basic string
    for (char c : resume.empty() ? std::string("latest") : resume) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    overrides.insert(overrides.begin(), "run.resume=\"" + quoted + "\"");
  }
  if (estimate_only) {
    try {
      return estimate(config_path, overrides, plugins, world_size, device_memory);
    } catch (const std::exception& e) {
      std::cerr << "smp-worker: --estimate-memory: error: " << e.what() << std::endl;
      return 1;
    }
  }
  if (world_size > 0 || !device_memory.empty()) {
    std::cerr << "smp-worker: --world-size and --device-memory go with --estimate-memory" << std::endl;
    return 1;
  }

  int rank = 0;
  try {
    smp::ProcessEnv env = smp::ProcessEnv::from_environment();
    rank = env.rank;
    smp::Config config = smp::Config::load(config_path, overrides);
    // A job continues in its folder: smp-worker asks for run.resume's default
    // ("auto") where the job says nothing (a program's runtime resumes only
    // when asked).
    if (!config.has("run.resume")) {
      overrides.push_back("run.resume=auto");
      config = smp::Config::load(config_path, overrides);
    }
    smp::logging::init(env.rank, env.world_size, config.get_string("run.dir"), config.get_bool("run.log_to_file"),
                       env.rank == 0);
    // The Trainer resumes, once smp-launch's hang detection is armed.
    smp::RuntimeOptions options;
    options.resume_at_create = false;
    auto runtime = smp::Runtime::create(config, env, {plugins.begin(), plugins.end()}, options);
    smp::run_training(*runtime);
    runtime->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "smp-worker rank " << rank << ": error: " << e.what() << std::endl;
    spdlog::error("{}", e.what());
    return 1;
  }
}
