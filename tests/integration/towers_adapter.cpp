// A non-chain test model (NCF-like): two towers over the same input, a merge,
// and a skip connection from tower A into the head, regression loss.
#include <smp/sdk/plugin.hpp>

#include <ATen/ATen.h>

namespace towers {

using smp::sdk::Json;

class TowersAdapter : public smp::sdk::Adapter {
 public:
  TowersAdapter(const Json& cfg, uint64_t seed) : seed_(seed) {
    width_ = cfg.value("width", 16);
    hidden_ = cfg.value("hidden", 32);
  }
  void describe(smp::sdk::GraphBuilder& g) override {
    const int64_t w = width_, h = hidden_;
    g.input("x");
    g.input("y");
    for (std::string t : {"towerA", "towerB"}) {
      std::string p = t == "towerA" ? "a" : "b";
      g.node({t + ".fc1", "linear", {{"in", w}, {"out", h}}, {"x"}, {p + "1"}});
      g.node({t + ".act", "relu", Json::object(), {p + "1"}, {p + "2"}});
      g.node({t + ".fc2", "linear", {{"in", h}, {"out", w}}, {p + "2"}, {p + "3"}});
    }
    g.node({"merge", "concat", {{"dim", -1}}, {"a3", "b3"}, {"m"}});
    g.node({"head.fc1", "linear", {{"in", 2 * w}, {"out", w}}, {"m"}, {"h1"}});
    g.node({"head.skip", "add", Json::object(), {"h1", "a3"}, {"h2"}});
    g.node({"head.act", "relu", Json::object(), {"h2"}, {"h3"}});
    g.node({"head.out", "linear", {{"in", w}, {"out", 1}}, {"h3"}, {"pred"}});
    g.node({"loss", "mse_loss", Json::object(), {"pred", "y"}, {"loss"}});
    g.loss("loss");
  }
  std::vector<at::Tensor> batch(const smp::sdk::BatchRequest& r) override {
    std::vector<at::Tensor> xs;
    for (int64_t i = 0; i < r.num_samples; ++i) {
      uint64_t s = seed_ * 1000003ULL + static_cast<uint64_t>(r.step) * 7919ULL + static_cast<uint64_t>(r.first_sample + i) +
                   (r.split == SMP_SPLIT_VALIDATION ? 555555ULL : 0ULL);
      xs.push_back(at::randn({width_}, smp::sdk::init_generator(s)));
    }
    at::Tensor x = at::stack(xs);
    at::Tensor y = (x.sin().sum(-1, true) + 0.5 * x.narrow(1, 0, 1)).contiguous();
    return {x, y};
  }

 private:
  uint64_t seed_;
  int64_t width_, hidden_;
};

}  // namespace towers

SMP_PLUGIN(smp::sdk::PluginBuilder("towers", "0.1.0").adapter<towers::TowersAdapter>("towers"))
