// A recommender trained on interactions the program makes itself, then used
// to score new (user, item) pairs through smp's forward-only call.
//
//   recommender [steps] [key=value ...]                  # one rank
//   smp-launch --nproc-per-node 2 --worker recommender -- 200 parallel.dp=2
//
// Each user and item has a hidden taste vector; a user likes an item when
// their dot product is positive. The model (embeddings and an MLP over both)
// learns that from sampled pairs; the program then ranks held-out pairs and
// prints their AUC. Every rank makes the same global batch; smp takes each
// data-parallel rank's rows.
#include <smp/torch.h>

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

constexpr int64_t kUsers = 64, kItems = 48, kTaste = 4, kDim = 16, kBatch = 64;

struct TwoTowerImpl : torch::nn::Module {
  TwoTowerImpl()
      : users(register_module("users", torch::nn::Embedding(kUsers, kDim))),
        items(register_module("items", torch::nn::Embedding(kItems, kDim))),
        mlp(register_module("mlp", torch::nn::Sequential(torch::nn::Linear(2 * kDim, kDim), torch::nn::ReLU(),
                                                          torch::nn::Linear(kDim, 1)))) {}
  torch::Tensor forward(torch::Tensor user, torch::Tensor item) {
    torch::Tensor u = users->forward(user), i = items->forward(item);
    return mlp->forward(torch::cat({u * i, u + i}, 1)).squeeze(1);  // one logit per pair
  }
  torch::nn::Embedding users, items;
  torch::nn::Sequential mlp;
};
TORCH_MODULE(TwoTower);

// The hidden tastes, and pairs drawn from them: (users, items, liked).
struct World {
  torch::Tensor user_taste, item_taste;
  explicit World(uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    user_taste = at::randn({kUsers, kTaste}, gen);
    item_taste = at::randn({kItems, kTaste}, gen);
  }
  std::vector<torch::Tensor> pairs(int64_t n, uint64_t seed) const {
    auto gen = at::detail::createCPUGenerator(seed);
    torch::Tensor u = at::randint(0, kUsers, {n}, gen, at::kLong), i = at::randint(0, kItems, {n}, gen, at::kLong);
    torch::Tensor liked = ((user_taste.index_select(0, u) * item_taste.index_select(0, i)).sum(1) > 0).to(at::kFloat);
    return {u, i, liked};
  }
};

// The probability that a liked pair outranks a disliked one.
double auc(const torch::Tensor& scores, const torch::Tensor& liked) {
  torch::Tensor pos = scores.masked_select(liked > 0.5), neg = scores.masked_select(liked < 0.5);
  if (pos.numel() == 0 || neg.numel() == 0) return 0.5;
  return (pos.unsqueeze(1) > neg.unsqueeze(0)).to(at::kDouble).mean().item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
  try {
    torch::manual_seed(0);
    TwoTower tower;
    smp::sdk::TorchModel model("recommender");
    model.input("users").input("items").input("liked").node("tower", tower, {"users", "items"}, {"logit"}).loss(
        "loss", [](auto logit, auto liked) { return torch::binary_cross_entropy_with_logits(logit, liked); },
        {"logit", "liked"});
    const World world(42);
    const auto example = world.pairs(kBatch, 0);
    smp::Options options;
    options.optimizer(torch::optim::AdamWOptions(0.03).weight_decay(0)).batch_size(kBatch).steps(steps)
        .example({{"users", example[0]}, {"items", example[1]}, {"liked", example[2]}})
        .args(argc, argv, argc > 1 ? 2 : 1);  // the program's key=value arguments
    auto runtime = smp::Runtime::create(options, smp::ProcessEnv::from_environment(), {model.plugin()});
    for (int64_t step = runtime->steps_done(); step < steps; ++step) {
      const auto b = world.pairs(kBatch, 1000 + static_cast<uint64_t>(step));  // the global batch
      const smp::StepResult r = runtime->train_step({{"users", b[0]}, {"items", b[1]}, {"liked", b[2]}});
      if (step % 50 == 0 || step + 1 == steps) std::cout << "step " << step << " loss " << r.loss << "\n";
    }
    // New pairs, scored without labels: the loss node does not run.
    const auto held_out = world.pairs(2048, 7);
    const smp::Batch scored = runtime->forward({{"users", held_out[0]}, {"items", held_out[1]}}, {"logit"});
    std::cout << "held-out AUC " << auc(scored.at("logit"), held_out[2]) << "\n";
    runtime->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "recommender: " << e.what() << "\n";
    return 1;
  }
}
