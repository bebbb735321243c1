// The MLP-Mixer example: plain.cpp trains it with a plain LibTorch loop,
// smp.cpp through smp (docs/embedding.md shows the difference).
#include "mixer.h"
#include <smp/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
  torch::manual_seed(0);
  torch::nn::Sequential net = make_mixer(4);
  smp::sdk::TorchModel model = smp::sdk::TorchModel("mixer").input("images").input("labels").sequential("net", net,
      "images", "scores").loss("loss", [](auto s, auto y) { return torch::nn::functional::cross_entropy(s, y); },
      {"scores", "labels"});
  smp::Config config = smp::Config::from_string("train = { optimizer = 'sgd', lr = 0.1, min_lr = 0.1, weight_decay = 0,"
      " grad_clip = 0, batch_size = 32 }", "mixer", {argv + (argc > 1 ? 2 : 1), argv + argc});  // + key=value args
  auto runtime = smp::Runtime::create(config, smp::ProcessEnv::from_environment(), {model.plugin()},
      {{"images", make_batch(0).first}, {"labels", make_batch(0).second}});  // an example batch, for the profile
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    auto [images, labels] = make_batch(step);
    torch::Tensor loss = torch::tensor(runtime->train_step({{"images", images}, {"labels", labels}}).loss);
    std::cout << "step " << step << " loss " << loss.item<double>() << "\n";
  }
  std::cout << "train seconds " << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << "\n";
  auto [images, labels] = make_batch(1000);
  torch::NoGradGuard no_grad;
  torch::Tensor scores = runtime->forward({{"images", images}}, {"scores"}).at("scores");
  std::cout << "held-out accuracy " << (scores.argmax(1) == labels).to(torch::kFloat).mean().item<double>() << "\n";
  return 0;
}
