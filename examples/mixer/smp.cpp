// The MLP-Mixer of plain.cpp trained through smp: the same model, data and
// loop, partitioned over pp and replicated over dp by `smp-launch`.
//   smp-launch --nproc-per-node 2 --worker mixer_smp -- [steps] [key=value ...]
#include "mixer.h"

#include <smp/smp.h>
#include <smp/sdk/torch_module.hpp>

#include <algorithm>
#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
  torch::manual_seed(0);
  torch::nn::Sequential net = make_mixer(4);
  smp::sdk::TorchModel model("mixer");
  model.input("images").input("labels").sequential("net", net, "images", "scores").loss("loss",
      [](torch::Tensor s, torch::Tensor y) { return torch::nn::functional::cross_entropy(s, y); }, {"scores", "labels"});
  std::vector<std::string> settings = {"train.optimizer=sgd", "train.lr=0.1", "train.min_lr=0.1",
                                       "train.weight_decay=0", "train.grad_clip=0", "train.batch_size=32"};
  settings.insert(settings.end(), argv + std::min(argc, 2), argv + argc);  // pp, dp, ... as key=value
  smp::Config config = smp::Config::from_string("", "mixer", settings);
  auto [example, example_labels] = make_batch(0);
  auto runtime = smp::Runtime::create(config, smp::ProcessEnv::from_environment(), {model.plugin()},
                                      {{"images", example}, {"labels", example_labels}});
  for (int step = 0; step < steps; ++step) {
    auto [images, labels] = make_batch(step);
    smp::StepResult result = runtime->train_step({{"images", images}, {"labels", labels}});
    std::cout << "step " << step << " loss " << result.loss << "\n";
  }
  auto [images, labels] = make_batch(1000);
  torch::NoGradGuard no_grad;
  torch::Tensor scores = runtime->forward({{"images", images}}, {"scores"}).at("scores");
  std::cout << "held-out accuracy " << (scores.argmax(1) == labels).to(torch::kFloat).mean().item<double>() << "\n";
  return 0;
}
