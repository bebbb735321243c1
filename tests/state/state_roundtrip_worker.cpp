// One rank of the in-memory train-state round trip (state_test.cpp), started
// by smp-launch --worker: runtime A trains --steps steps and its state is
// copied; runtime B, a fresh one of the same job, loads the copy; both take
// one more step, which must agree bit for bit (loss, gradient norm and every
// state entry). Runtime C, fresh and loading nothing, must differ from A
// after that step, so the check can fail. B and C join the job on the next
// two ports after A's. With --through-disk DIR the copy goes through a
// checkpoint instead: A saves it (Checkpointer::save), B loads it (Checkpointer::load).
#include <smp/config.h>
#include <smp/error.h>
#include <smp/process_env.h>
#include <smp/runtime.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace {

std::vector<smp::StateEntry> copy_of(const std::vector<smp::StateEntry>& entries) {
  std::vector<smp::StateEntry> out = entries;
  for (auto& e : out) e.local = e.local.clone();
  return out;
}

// The first entry whose values differ, or "" when all agree bit for bit.
std::string first_difference(const std::vector<smp::StateEntry>& a, const std::vector<smp::StateEntry>& b) {
  if (a.size() != b.size()) return "entry counts " + std::to_string(a.size()) + " and " + std::to_string(b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name) return "entry " + std::to_string(i) + " names " + a[i].name + " and " + b[i].name;
    if (!at::equal(a[i].local, b[i].local)) return a[i].name;
  }
  return "";
}

// Bit-for-bit equal, NaN included (an fp16 step that overflowed has a NaN norm on both sides).
bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"train-state round trip, one rank"};
  std::vector<std::string> plugins, overrides;
  std::string config_path;
  int steps = 2;
  std::string through_disk;
  app.add_option("--plugin", plugins)->required();
  app.add_option("--config", config_path)->required();
  app.add_option("--set", overrides);
  app.add_option("--steps", steps);
  app.add_option("--through-disk", through_disk, "save and load the state as a checkpoint in this folder");
  CLI11_PARSE(app, argc, argv);
  const smp::ProcessEnv env = smp::ProcessEnv::from_environment();
  auto create = [&](int port_offset) {
    smp::ProcessEnv e = env;
    e.master_port += port_offset;
    return smp::Runtime::create(smp::Config::load(config_path, overrides), e, {plugins.begin(), plugins.end()});
  };
  try {
    auto a = create(0);
    for (int i = 0; i < steps; ++i) a->train_step();
    const std::vector<smp::StateEntry> saved = copy_of(a->checkpoints().entries());
    if (!through_disk.empty()) a->checkpoints().save(through_disk);
    size_t sliced = 0;
    for (const auto& e : saved) sliced += e.flat_begin >= 0 || e.global_shape != e.block_shape;
    const smp::StepResult ra = a->train_step();
    const std::vector<smp::StateEntry> after_a = copy_of(a->checkpoints().entries());

    auto b = create(1);
    b->gather_parameters();  // ZeRO-3: gathered copies of the old values must not outlive the load
    if (through_disk.empty()) b->checkpoints().load_entries(saved);
    else b->checkpoints().load(through_disk);
    if (b->steps_done() != steps) throw smp::Error("runtime B is at step " + std::to_string(b->steps_done()));
    const smp::StepResult rb = b->train_step();
    const std::string diff = first_difference(after_a, b->checkpoints().entries());
    const bool identical = same(ra.loss, rb.loss) && same(ra.grad_norm, rb.grad_norm) && diff.empty();
    if (!identical)
      std::printf("rank %d: state round trip DIFFERS: loss %.17g / %.17g, grad norm %.17g / %.17g, first entry %s\n",
                  env.rank, ra.loss, rb.loss, ra.grad_norm, rb.grad_norm, diff.empty() ? "-" : diff.c_str());
    auto c = create(2);
    const smp::StepResult rc = c->train_step();
    const bool control_differs = !same(rc.loss, ra.loss) || !first_difference(after_a, c->checkpoints().entries()).empty();
    // Every rank's verdict, so rank 0 (whose output smp-launch shows) speaks for all.
    const std::vector<double> verdicts = a->gather_world(identical ? (control_differs ? 1.0 : 2.0) : 0.0);
    const std::vector<double> counts = a->gather_world(static_cast<double>(saved.size()));
    const std::vector<double> slices = a->gather_world(static_cast<double>(sliced));
    bool all = true;
    for (size_t r = 0; r < verdicts.size(); ++r) {
      if (verdicts[r] == 0.0) std::printf("rank %d: rank %zu's state round trip differs\n", env.rank, r);
      if (verdicts[r] == 2.0)
        std::printf("rank %d: on rank %zu a runtime that loaded nothing matches too: the check cannot fail\n",
                    env.rank, r);
      all = all && verdicts[r] == 1.0;
    }
    if (!all) return 1;
    if (env.rank == 0)
      for (size_t r = 0; r < verdicts.size(); ++r)
        std::printf("rank %zu: state round trip identical after step %d: %.0f entries (%.0f slices of larger "
                    "tensors), loss %.9g\n",
                    r, steps + 1, counts[r], slices[r], rb.loss);
    for (auto* rt : {c.get(), b.get(), a.get()}) rt->shutdown();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", env.rank, e.what());
    return 1;
  }
  return 0;
}
