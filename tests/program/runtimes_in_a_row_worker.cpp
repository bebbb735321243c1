// Three runtimes in a row in one process (issue 54): each is created, trains
// two steps on the program's own batches, shuts down and is destroyed before
// the next is created, over the same launcher's rendezvous (one master port).
// Run under smp-launch by runtimes_in_a_row_test.cpp.
//
//   runtimes_in_a_row_worker --out DIR [--runtimes N] [--steps S] [--set key=value ...]
//
// Writes one line per runtime to DIR/rank-<r>.txt (and stdout), "rank R
// runtime K losses L0 L1 ...", and exits 1 when a runtime fails or its losses differ from the first
// runtime's: every runtime starts from the same seed and data, so the losses
// are the same bit for bit.
#include <smp/smp.h>
#include <smp/sdk/torch_module.hpp>

#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kDim = 8, kClasses = 4, kBatch = 8;

// The global batch of a step, the same on every rank; each dp rank takes its rows.
std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step) {
  auto gen = at::detail::createCPUGenerator(2000 + static_cast<uint64_t>(step));
  torch::Tensor x = at::randn({kBatch, kDim}, gen);
  torch::Tensor y = at::randint(0, kClasses, {kBatch}, gen, at::kLong);
  return {x, y};
}

// One runtime's life: create, `steps` steps, shutdown, destroy. Its losses.
std::vector<double> one_runtime(int k, int steps, const std::string& out_dir, const std::vector<std::string>& overrides,
                                const smp::ProcessEnv& env) {
  torch::manual_seed(11);  // the same model every time
  torch::nn::Sequential net(torch::nn::Linear(kDim, 16), torch::nn::Functional(torch::relu), torch::nn::Linear(16, 16),
                            torch::nn::Functional(torch::tanh), torch::nn::Linear(16, kClasses));
  smp::sdk::TorchModel model("in_a_row");
  model.input("x").input("y").sequential("net", net, "x", "logits").loss(
      "loss", [](at::Tensor logits, at::Tensor y) { return torch::nn::functional::cross_entropy(logits, y); },
      {"logits", "y"});
  std::vector<std::string> config = {"train.steps=" + std::to_string(steps), "train.batch_size=8",
                                     "train.optimizer=sgd", "train.lr=0.5", "train.min_lr=0.5",
                                     "train.weight_decay=0", "train.grad_clip=0", "run.log_to_file=false",
                                     "run.timeout_s=30", "run.dir=" + out_dir + "/runtime-" + std::to_string(k)};
  config.insert(config.end(), overrides.begin(), overrides.end());
  const smp::Config cfg = smp::Config::from_string("", "runtimes_in_a_row_worker", config);
  const auto [x0, y0] = global_batch(0);
  std::unique_ptr<smp::Runtime> rt = smp::Runtime::create(cfg, env, {model.plugin()}, {{"x", x0}, {"y", y0}});
  const int dp = rt->mesh().size(smp::Axis::DP), dp_rank = rt->mesh().coord(smp::Axis::DP);
  const int64_t rows = kBatch / dp;
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    const auto [x, y] = global_batch(s);
    const smp::Batch share = {{"x", x.narrow(0, dp_rank * rows, rows)}, {"y", y.narrow(0, dp_rank * rows, rows)}};
    losses.push_back(rt->train_step(share).loss);
  }
  rt->shutdown();
  rt.reset();
  return losses;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"runtimes_in_a_row_worker"};
  std::string out_dir;
  std::vector<std::string> overrides;
  int runtimes = 3, steps = 2;
  app.add_option("--out", out_dir)->required();
  app.add_option("--runtimes", runtimes);
  app.add_option("--steps", steps);
  app.add_option("--set", overrides);
  CLI11_PARSE(app, argc, argv);
  const smp::ProcessEnv env = smp::ProcessEnv::from_environment();
  std::vector<double> first;
  for (int k = 0; k < runtimes; ++k) {
    std::vector<double> losses;
    try {
      losses = one_runtime(k, steps, out_dir, overrides, env);
    } catch (const std::exception& e) {
      std::cerr << "rank " << env.rank << " runtime " << k << ": error: " << e.what() << "\n";
      return 1;
    }
    std::ostringstream line;
    line << "rank " << env.rank << " runtime " << k << " losses";
    for (double l : losses) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), " %.17g", l);
      line << buf;
    }
    std::cout << line.str() << std::endl;
    std::ofstream(out_dir + "/rank-" + std::to_string(env.rank) + ".txt", std::ios::app) << line.str() << "\n";
    if (k == 0) {
      first = losses;
    } else if (losses != first) {
      std::cerr << "rank " << env.rank << " runtime " << k << ": error: losses differ from runtime 0's\n";
      return 1;
    }
  }
  return 0;
}
