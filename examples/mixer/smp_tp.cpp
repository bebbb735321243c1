// The MLP-Mixer example: plain.cpp trains it with a plain LibTorch loop,
// smp_tp.cpp is smp.cpp with a tensor-parallel plan on the unmodified layers (docs/embedding.md).
#include "mixer.h"
#include <smp/torch.h>

#include <chrono>
#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 30;
  torch::manual_seed(0);
  torch::nn::Sequential net = make_mixer(4);
  smp::parallelize(*net, {{"*.tokens.fc1", smp::TpStyle::Colwise}, {"*.tokens.fc2", smp::TpStyle::Rowwise},
                          {"*.channels.fc1", smp::TpStyle::Colwise}, {"*.channels.fc2", smp::TpStyle::Rowwise}});
  smp::Model model(net, torch::nn::CrossEntropyLoss(),  // + the program's key=value arguments: the layout
                   smp::Options().optimizer(torch::optim::SGDOptions(0.1)).args(argc, argv, 2));
  const auto start = std::chrono::steady_clock::now();
  for (int step = 0; step < steps; ++step) {
    auto [images, labels] = make_batch(step);
    torch::Tensor loss = torch::tensor(model.train_step({{"input", images}, {"target", labels}}).loss, torch::kDouble);
    std::cout << "step " << step << " loss " << loss.item<double>() << "\n";
  }
  std::cout << "train seconds " << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << "\n";
  auto [images, labels] = make_batch(1000);
  model.gather();  // every rank's modules hold the trained parameters
  torch::NoGradGuard no_grad;
  torch::Tensor scores = net->forward(images);
  std::cout << "held-out accuracy " << (scores.argmax(1) == labels).to(torch::kFloat).mean().item<double>() << "\n";
  return 0;
}
