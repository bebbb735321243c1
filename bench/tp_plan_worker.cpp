// The same MLP stack split over tp two ways, for bench/tp_plan_bench.py:
// --kinds sdk writes it with the SDK's ColumnParallelLinear/RowParallelLinear,
// --kinds plan with unmodified torch::nn::Linear layers and a plan
// (parallelize). Same initialisation, data and SGD; prints "train seconds"
// (the loop, not start-up) and the last loss.
//
//   smp-launch --nproc-per-node 2 --worker tp_plan_worker -- --kinds plan --steps 40 parallel.tp=2
#include <smp/torch.h>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <vector>

namespace {

constexpr int64_t kDim = 256, kBatch = 32, kBlocks = 4;

template <class Up, class Down>
struct BlockImpl : torch::nn::Module {
  BlockImpl() : up(register_module("up", Up(kDim, 4 * kDim))), down(register_module("down", Down(4 * kDim, kDim))) {}
  torch::Tensor forward(torch::Tensor x) { return x + down->forward(torch::gelu(up->forward(x))); }
  Up up;
  Down down;
};
using SdkBlock = BlockImpl<smp::sdk::ColumnParallelLinear, smp::sdk::RowParallelLinear>;
using PlainBlock = BlockImpl<torch::nn::Linear, torch::nn::Linear>;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tp_plan_worker"};
  std::string kinds = "plan";
  int steps = 40;
  std::vector<std::string> args;
  app.add_option("--kinds", kinds)->check(CLI::IsMember({"sdk", "plan"}));
  app.add_option("--steps", steps);
  app.add_option("args", args, "key=value");
  CLI11_PARSE(app, argc, argv);
  try {
    torch::manual_seed(0);
    torch::nn::Sequential net;
    for (int i = 0; i < kBlocks; ++i) {
      if (kinds == "sdk")
        net->push_back(std::make_shared<SdkBlock>());
      else
        net->push_back(std::make_shared<PlainBlock>());
    }
    if (kinds == "plan") smp::parallelize(*net, {{"*.up", smp::TpStyle::Colwise}, {"*.down", smp::TpStyle::Rowwise}});
    smp::Model model(net, [](at::Tensor y, at::Tensor t) { return torch::mse_loss(y, t); },
                     smp::Options().optimizer(torch::optim::SGDOptions(0.01)).args(args));
    auto gen = at::detail::createCPUGenerator(7);
    const at::Tensor x = at::randn({kBatch, kDim}, gen), t = at::randn({kBatch, kDim}, gen);
    model.train_step({{"input", x}, {"target", t}});  // the runtime is made here: not timed
    const auto start = std::chrono::steady_clock::now();
    double loss = 0;
    std::vector<double> each;  // every step's seconds: their median is robust to the machine's bursts
    for (int s = 1; s < steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      loss = model.train_step({{"input", x}, {"target", t}}).loss;
      each.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::cout << "train seconds " << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()
              << "\n";
    if (!each.empty()) {
      std::nth_element(each.begin(), each.begin() + static_cast<std::ptrdiff_t>(each.size() / 2), each.end());
      std::cout << "median step seconds " << each[each.size() / 2] << "\n";
    }
    std::cout << "last loss " << loss << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "tp_plan_worker: " << e.what() << "\n";
    return 1;
  }
}
