// smp-plan: the fastest layout that fits, predicted for a cluster.
//
//   smp-plan --cluster dgx-a100-80gb --world 512 --layers 48 --hidden 8192 --heads 64 --seq 2048
//            --vocab 51200 --batch 1536 [--ffn F] [--dtype fp16] [--tp N] [--pp N] [--top 5] [--json]
//   smp-plan --cluster dgx-a100-80gb --world 8 --config job.toml [--plugin gpt] [--set key=value ...]
//   smp-plan --cluster dgx-a100-80gb --validate bench/configs/plan-published.json [--out F]
//   smp-plan --calibrate this-machine.toml [--threads 1]     measure this machine into a cluster file
//
// With --config the shape is the job's (its graph's transformer layers,
// embedding and tokens per sample; train.batch_size and train.precision), and each layout
// listed has passed smp's own memory estimate (what smp-launch
// --estimate-memory prints for it), which the memory column then shows: the
// ranked layouts are taken in order and those the estimate puts over the
// accelerator's memory are left out.
//
// The cluster is a preset name (configs/clusters/<name>.toml) or a file
// (plan/cluster.h). The table lists the top layouts with their
// predicted step time and every term of it, tokens/s, TFLOP/s per device,
// MFU, memory per rank, and the --set lines that run the layout. --validate
// predicts published runs (their layout given; the microbatch size and
// virtual stages searched), and what the search itself picks for them.
#include "plan/calibrate.h"
#include "plan/job_plan.h"
#include "plan/job_shape.h"
#include "plan/search.h"
#include "plan/validate.h"

#include <smp/config.h>
#include <smp/error.h>
#include <smp/process_env.h>
#include <smp/runtime.h>
#include <smp/sdk/input_file.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

namespace {

using nlohmann::json;
using namespace smp::plan;

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

void print_table(const SearchResult& r, const Shape& s, size_t top) {
  std::printf("%-44s %9s %7s %7s %7s %7s %7s %7s %7s %7s %9s %8s %6s %9s\n", "layout", "step (s)", "compute", "tp", "pp",
              "ep", "cp", "bubble", "dp", "optim", "tokens/s", "TFLOP/s", "MFU", "mem (GB)");  // memory to 3 significant digits: a small job's too
  for (size_t i = 0; i < std::min(top, r.ranked.size()); ++i) {
    const Prediction& p = r.ranked[i].prediction;
    const auto share = [&](double x) { return fixed(100 * x / p.step_seconds, 1) + "%"; };
    std::printf("%-44s %9.3g %7s %7s %7s %7s %7s %7s %7s %7s %9.3g %8.3g %5.1f%% %9.3g\n",
                r.ranked[i].layout.describe().c_str(), p.step_seconds, share(p.compute).c_str(),
                share(p.tp_comm).c_str(), share(p.pp_comm).c_str(), share(p.ep_comm).c_str(),
                share(p.cp_comm).c_str(), share(p.bubble).c_str(), share(p.dp_comm).c_str(),
                share(p.optimizer).c_str(), p.tokens_per_s, p.tflops_per_device, 100 * p.mfu, p.memory_bytes / 1e9);
  }
  if (!r.ranked.empty()) {
    std::printf("\nthe best, to run it:");
    for (const auto& set : r.ranked.front().layout.sets(s)) std::printf(" --set %s", set.c_str());
    std::printf("\n");
  }
}

int validate(const Cluster& c, const std::string& path, const std::string& out) {
  json published;
  try {
    published = smp::input::read_json(path, path);
  } catch (const smp::input::Error& e) {
    throw smp::Error(e.what());
  }
  const json result = validate_published(c, published);
  for (const json& r : result["rows"]) {
    const json& best = r["search"]["best"];
    std::printf("%-8s tp %d pp %d on %d: published %.0f, predicted %.1f TFLOP/s per GPU (%+.1f%%); the search picks "
                "%s at %.1f TFLOP/s (%lld candidates, %.3f s)\n",
                r.value("params", "").c_str(), r["tp"].get<int>(), r["pp"].get<int>(), r["gpus"].get<int>(),
                r["tflops_per_gpu"].get<double>(), r.value("predicted_tflops_per_gpu", 0.0), 100 * r.value("error", 0.0),
                best.is_null() ? "nothing" : best["layout"].get<std::string>().c_str(),
                best.is_null() ? 0.0 : best["tflops_per_device"].get<double>(),
                static_cast<long long>(r["search"]["candidates"].get<int64_t>()), r["search"]["seconds"].get<double>());
  }
  if (!out.empty()) std::ofstream(out) << result.dump(2) << "\n";
  return result["all_within_15_percent"].get<bool>() ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"smp-plan: the fastest layout that fits, predicted for a cluster"};
  std::string cluster_name, validate_path, out;
  Shape s;
  SearchOptions o;
  size_t top = 5;
  bool as_json = false;
  std::string calibrate_path;
  int threads = 1;
  app.add_option("--calibrate", calibrate_path, "measure this machine and write its cluster file here");
  // At most the machine's cores: calibration measures them, and threads past them measure nothing.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  app.add_option("--threads", threads, "--calibrate: intra-op threads per rank (at most the machine's cores)")
      ->check(CLI::Range(1, cores));
  app.add_option("--cluster", cluster_name, "a preset (configs/clusters/<name>.toml) or a cluster file");
  app.add_option("--validate", validate_path, "predict the published runs of this file (and exit 3 past 15%)");
  app.add_option("--out", out, "--validate: write the result JSON here");
  app.add_option("--world", o.world, "accelerators (at most " + std::to_string(smp::kMaxWorldSize) + ")")
      ->check(CLI::Range(1, smp::kMaxWorldSize));
  std::string config_path, plugin = "gpt";
  std::vector<std::string> sets;
  app.add_option("--config", config_path, "a job file: the model's shape from it, memory from smp's estimate");
  app.add_option("--plugin", plugin, "--config: the job's adapter plugin");
  app.add_option("--set", sets, "--config: key=value over the job file (repeatable)");
  app.add_option("--layers", s.layers)->check(CLI::PositiveNumber);
  app.add_option("--hidden", s.hidden)->check(CLI::PositiveNumber);
  app.add_option("--heads", s.heads)->check(CLI::PositiveNumber);
  app.add_option("--seq", s.seq)->check(CLI::PositiveNumber);
  app.add_option("--vocab", s.vocab)->check(CLI::PositiveNumber);
  app.add_option("--ffn", s.ffn, "MLP width (default 4 x hidden)")->check(CLI::NonNegativeNumber);
  app.add_option("--batch", s.batch, "global batch, samples")->check(CLI::PositiveNumber);
  app.add_option("--dtype", s.dtype, "compute dtype")->check(CLI::IsMember({"fp16", "bf16", "fp32"}));
  app.add_option("--tp", o.tp, "only this tp")->check(CLI::NonNegativeNumber);
  app.add_option("--pp", o.pp, "only this pp")->check(CLI::NonNegativeNumber);
  app.add_option("--ep", o.ep, "only this ep (a model with experts)")->check(CLI::NonNegativeNumber);
  app.add_option("--top", top, "layouts to list")->check(CLI::PositiveNumber);
  app.add_flag("--json", as_json, "the result as JSON");
  CLI11_PARSE(app, argc, argv);
  // The job's layout is what the search varies: a job that leaves it to the
  // planner (parallel.layout = "auto") is read as any other.
  const JobFile job{config_path, plugin, planning_sets(sets)};
  try {
    if (!calibrate_path.empty()) {
      std::cout << calibrate(calibrate_path, threads);
      std::cerr << "smp-plan: wrote " << calibrate_path << " (read back: " << read_cluster(calibrate_path).name << ")"
                << std::endl;
      return 0;
    }
    if (cluster_name.empty()) throw smp::Error("--cluster is required (a preset name or a cluster file)");
    const Cluster c = load_cluster(cluster_name);
    if (!validate_path.empty()) return validate(c, validate_path, out);
    if (!config_path.empty()) s = shape_of_job(smp::Config::load(config_path, job.sets), o.world, plugin);
    check_shape(s);
    const Plan p = make_plan(c, s, o, top, job);
    const SearchResult& r = p.result;
    if (as_json) {
      std::cout << plan_json(c, p, top, job).dump(2) << std::endl;
    } else {
      std::printf("%s: %lld layouts predicted in %.3f s, %lld fit in %.0f GB\n", c.name.c_str(),
                  static_cast<long long>(r.candidates), p.search_seconds, static_cast<long long>(r.fitting),
                  c.memory_bytes / 1e9);
      if (!config_path.empty())
        std::printf("memory: smp's estimate for %s (smp-launch --estimate-memory); %lld of the fastest left out by "
                    "it\n", config_path.c_str(), static_cast<long long>(p.left_out));
      std::printf("\n");
      print_table(r, s, top);
    }
    if (r.ranked.empty()) {
      std::cerr << "smp-plan: " << no_layout_reason(c, p, o.world) << std::endl;
      return 2;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "smp-plan: error: " << e.what() << std::endl;
    return 1;
  }
}
