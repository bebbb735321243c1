// A program that keeps its optimizer's options, its loop and its learning-rate
// schedule (issue 54), next to its plain LibTorch twin in the same process:
// the same model (same seed), the same batches, torch::optim's own optimizer
// in a plain loop. Prints both runs' losses and final parameters as JSON.
//
//   options_worker --optimizer sgd|sgd-momentum|by-key|adam|adamw|amsgrad --out F [key=value ...]
#include <smp/torch.h>
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>

namespace {

constexpr int64_t kBatch = 8, kIn = 16, kHidden = 32, kClasses = 4;
constexpr int kSteps = 6;

torch::nn::Sequential make_net() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(kIn, kHidden), torch::nn::Tanh(), torch::nn::Linear(kHidden, kClasses));
}

std::pair<torch::Tensor, torch::Tensor> batch(int64_t step) {
  auto gen = at::detail::createCPUGenerator(500 + static_cast<uint64_t>(step));
  return {at::randn({kBatch, kIn}, gen), at::randint(0, kClasses, {kBatch}, gen, at::kLong)};
}

// The program's schedule: the rate halves every 2 steps (as torch::optim::StepLR(2, 0.5)).
double rate(double base, int64_t step) { return base * std::pow(0.5, static_cast<double>(step / 2)); }

nlohmann::json values(const torch::Tensor& t) {
  torch::Tensor c = t.detach().to(torch::kDouble).contiguous().flatten();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

nlohmann::json parameters(torch::nn::Module& net) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& p : net.named_parameters()) out[p.key()] = values(p.value());
  return out;
}

struct Choice {
  std::unique_ptr<torch::optim::Optimizer> plain;
  double lr = 0;
};

// The same options to LibTorch's optimizer and to smp::Options.
Choice choose(const std::string& name, torch::nn::Module& net, smp::Options& options) {
  Choice c;
  if (name == "sgd") {
    torch::optim::SGDOptions o(0.05);
    c.plain = std::make_unique<torch::optim::SGD>(net.parameters(), o);
    options.optimizer(o);
    c.lr = o.lr();
  } else if (name == "sgd-momentum") {
    torch::optim::SGDOptions o = torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-2);
    c.plain = std::make_unique<torch::optim::SGD>(net.parameters(), o);
    options.optimizer(o);
    c.lr = o.lr();
  } else if (name == "by-key") {  // no option class: the optimizer named by its keys
    torch::optim::SGDOptions o(0.05);
    c.plain = std::make_unique<torch::optim::SGD>(net.parameters(), o);
    options.set("train.optimizer", "sgd").set("train.lr", 0.05).set("train.weight_decay", 0.0);
    c.lr = o.lr();
  } else if (name == "adam" || name == "amsgrad") {
    torch::optim::AdamOptions o = torch::optim::AdamOptions(1e-2).weight_decay(1e-2).amsgrad(name == "amsgrad");
    c.plain = std::make_unique<torch::optim::Adam>(net.parameters(), o);
    options.optimizer(o);
    c.lr = o.lr();
  } else {
    torch::optim::AdamWOptions o(1e-2);
    c.plain = std::make_unique<torch::optim::AdamW>(net.parameters(), o);
    options.optimizer(o);
    c.lr = o.lr();
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"options_worker"};
  std::string optimizer = "sgd", out;
  std::vector<std::string> args;
  app.add_option("--optimizer", optimizer);
  app.add_option("--out", out)->required();
  app.add_option("args", args, "key=value program arguments");
  CLI11_PARSE(app, argc, argv);
  try {
    nlohmann::json result;
    {  // The plain program.
      torch::nn::Sequential net = make_net();
      smp::Options unused;
      Choice c = choose(optimizer, *net, unused);
      for (int64_t step = 0; step < kSteps; ++step) {
        for (auto& group : c.plain->param_groups()) group.options().set_lr(rate(c.lr, step));
        const auto [x, y] = batch(step);
        c.plain->zero_grad();
        torch::Tensor loss = torch::nn::functional::cross_entropy(net->forward(x), y);
        loss.backward();
        c.plain->step();
        result["plain_losses"].push_back(loss.item<double>());
      }
      result["plain_params"] = parameters(*net);
    }
    // The same program through smp: the model handed over as it is, the loop kept.
    torch::nn::Sequential net = make_net();
    smp::sdk::TorchModel model = smp::sdk::TorchModel("mlp").input("x").input("y").sequential("net", net, "x", "scores")
        .loss("loss", [](auto s, auto y) { return torch::nn::functional::cross_entropy(s, y); }, {"scores", "y"});
    smp::Options options;
    const double lr = choose(optimizer, *net, options).lr;
    options.batch_size(kBatch).set("run.log_to_file", false).dir(out + ".run").args(args);
    auto runtime = smp::Runtime::create(options, smp::ProcessEnv::from_environment(), {model.plugin()});
    for (int64_t step = runtime->steps_done(); step < kSteps; ++step) {
      runtime->set_learning_rate(rate(lr, step));
      const auto [x, y] = batch(step);
      result["smp_losses"].push_back(runtime->train_step({{"x", x}, {"y", y}}).loss);
    }
    smp::gather_into_modules(*runtime, model);
    result["smp_params"] = parameters(*net);
    runtime->shutdown();
    std::ofstream(out) << result.dump();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
