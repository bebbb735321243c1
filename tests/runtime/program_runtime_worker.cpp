// A program driving a Runtime itself (issue 54's smaller points), run under
// smp-launch by program_runtime_test.cpp: forward() over a batch that does not
// divide by parallel.microbatches, training steps, and what such a run prints
// and writes (LibTorch's allocator warnings, the per-rank log files).
//
//   program_runtime_worker --dir DIR [--set key=value ...] [--steps N] [--forward-rows N ...]
//
// Prints, per rank, "rank R forward N rows: R' rows, gap G" (G: the largest
// difference from the same model in plain LibTorch, before any step) or
// "rank R forward N rows refused: <message>", then "rank R done".
#include <smp/smp.h>
#include <smp/sdk/torch_module.hpp>

#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kDim = 8, kClasses = 4, kBatch = 8;

torch::nn::Sequential make_net() {
  torch::manual_seed(11);
  return torch::nn::Sequential(torch::nn::Linear(kDim, 16), torch::nn::Tanh(), torch::nn::Linear(16, 16),
                               torch::nn::Tanh(), torch::nn::Linear(16, kClasses));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"program_runtime_worker"};
  std::string dir;
  std::vector<std::string> overrides;
  std::vector<int64_t> forward_rows;
  int steps = 0;
  app.add_option("--dir", dir, "run.dir")->required();
  app.add_option("--set", overrides);
  app.add_option("--steps", steps);
  app.add_option("--forward-rows", forward_rows);
  CLI11_PARSE(app, argc, argv);
  const smp::ProcessEnv env = smp::ProcessEnv::from_environment();
  const std::string me = "rank " + std::to_string(env.rank);
  try {
    torch::nn::Sequential reference = make_net();  // the same model, kept in plain LibTorch
    smp::sdk::TorchModel model("mlp");
    model.input("x").input("y").sequential("net", make_net(), "x", "logits").loss(
        "loss", [](at::Tensor logits, at::Tensor y) { return torch::nn::functional::cross_entropy(logits, y); },
        {"logits", "y"});
    std::vector<std::string> config = {"train.batch_size=" + std::to_string(kBatch), "train.optimizer=sgd",
                                       "train.lr=0.1", "train.min_lr=0.1", "train.weight_decay=0",
                                       "train.grad_clip=0", "run.timeout_s=120", "run.dir=" + dir};
    config.insert(config.end(), overrides.begin(), overrides.end());
    auto gen = at::detail::createCPUGenerator(5);
    const at::Tensor x = at::randn({kBatch, kDim}, gen), y = at::randint(0, kClasses, {kBatch}, gen, at::kLong);
    auto rt = smp::Runtime::create(smp::Config::from_string("", "program_runtime_worker", config), env,
                                   {model.plugin()}, {{"x", x}, {"y", y}});
    for (int64_t rows : forward_rows) {
      const at::Tensor in = at::randn({rows, kDim}, gen);
      try {
        const at::Tensor out = rt->forward({{"x", in}}, {"logits"}).at("logits");
        torch::NoGradGuard no_grad;
        const double gap = (out - reference->forward(in)).abs().max().item<double>();
        std::cout << me << " forward " << rows << " rows: " << out.size(0) << " rows, gap " << gap << std::endl;
      } catch (const smp::Error& e) {
        std::cout << me << " forward " << rows << " rows refused: " << e.what() << std::endl;
      }
    }
    for (int s = 0; s < steps; ++s) {
      const smp::StepResult r = rt->train_step({{"x", x}, {"y", y}});
      std::cout << me << " step " << s << " loss " << r.loss << std::endl;
    }
    rt->shutdown();
    std::cout << me << " done" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << me << ": error: " << e.what() << std::endl;
    return 1;
  }
}
