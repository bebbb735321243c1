// A small MLP-Mixer (Tolstikhin et al. 2021) in plain LibTorch, and the
// generated data it learns: images whose class is the quadrant holding a
// bright square. Shared by plain.cpp and smp.cpp; nothing here knows smp.
#pragma once

#include <torch/torch.h>

#include <utility>

constexpr int64_t kImage = 16, kPatch = 4, kChannels = 32, kClasses = 4, kBatch = 32;
constexpr int64_t kPatches = (kImage / kPatch) * (kImage / kPatch);

// Cuts [B, 1, H, W] into patches and embeds each: [B, patches, channels].
struct PatchEmbedImpl : torch::nn::Module {
  PatchEmbedImpl() : proj(register_module("proj", torch::nn::Linear(kPatch * kPatch, kChannels))) {}
  torch::Tensor forward(torch::Tensor images) {
    auto p = images.unfold(2, kPatch, kPatch).unfold(3, kPatch, kPatch);  // B,1,h,w,P,P
    return proj->forward(p.reshape({images.size(0), kPatches, kPatch * kPatch}));
  }
  torch::nn::Linear proj;
};
TORCH_MODULE(PatchEmbed);

struct MlpImpl : torch::nn::Module {
  MlpImpl(int64_t dim, int64_t hidden)
      : fc1(register_module("fc1", torch::nn::Linear(dim, hidden))), fc2(register_module("fc2", torch::nn::Linear(hidden, dim))) {}
  torch::Tensor forward(torch::Tensor x) { return fc2->forward(torch::gelu(fc1->forward(x))); }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Mlp);

// Token mixing across patches, then channel mixing, each with a residual.
struct MixerBlockImpl : torch::nn::Module {
  MixerBlockImpl()
      : norm1(register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kChannels})))),
        tokens(register_module("tokens", Mlp(kPatches, 2 * kPatches))),
        norm2(register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kChannels})))),
        channels(register_module("channels", Mlp(kChannels, 4 * kChannels))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = x + tokens->forward(norm1->forward(x).transpose(1, 2)).transpose(1, 2);
    return x + channels->forward(norm2->forward(x));
  }
  torch::nn::LayerNorm norm1;
  Mlp tokens;
  torch::nn::LayerNorm norm2;
  Mlp channels;
};
TORCH_MODULE(MixerBlock);

struct HeadImpl : torch::nn::Module {
  HeadImpl()
      : norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kChannels})))),
        fc(register_module("fc", torch::nn::Linear(kChannels, kClasses))) {}
  torch::Tensor forward(torch::Tensor x) { return fc->forward(norm->forward(x).mean(1)); }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc;
};
TORCH_MODULE(Head);

inline torch::nn::Sequential make_mixer(int blocks) {
  torch::nn::Sequential net;
  net->push_back(PatchEmbed());
  for (int i = 0; i < blocks; ++i) net->push_back(MixerBlock());
  net->push_back(Head());
  return net;
}

// Batch `step`: noise plus a bright square in the quadrant that is the label.
inline std::pair<torch::Tensor, torch::Tensor> make_batch(int64_t step) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(step) + 1);
  torch::Tensor labels = at::randint(0, kClasses, {kBatch}, gen, at::kLong);
  torch::Tensor images = at::randn({kBatch, 1, kImage, kImage}, gen) * 0.5;
  for (int64_t i = 0; i < kBatch; ++i) {
    const int64_t q = labels[i].item<int64_t>(), r = (q / 2) * (kImage / 2) + 2, c = (q % 2) * (kImage / 2) + 2;
    images[i][0].narrow(0, r, 4).narrow(1, c, 4) += 2.0;
  }
  return {images, labels};
}
