// smp's side of the Hugging Face reference test (checkpoint_test's
// CheckpointTool.TheExportedLlamaScoresAsTransformersDoes): one process loads
// a checkpoint into the gpt adapter (run.init_from among the overrides) and
// scores the tokens of a file with the runtime's own evaluation.
//
//   smp_hf_eval <gpt plugin> <config.toml> <tokens file> [key=value ...]
//
// The tokens file: whitespace-separated ids, train.batch_size rows of
// model.seq_len + 1 (a row's first seq_len are the inputs, its last seq_len
// the targets). Prints one JSON line: {"loss": evaluate(batch), "logits":
// [row][position][vocabulary entry] of forward(batch, {"logits"}), every entry}.
#include <smp/smp.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <iterator>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: smp_hf_eval <gpt plugin> <config.toml> <tokens file> [key=value ...]\n";
    return 2;
  }
  try {
    smp::Config config = smp::Config::load(argv[2], std::vector<std::string>(argv + 4, argv + argc));
    auto rt = smp::Runtime::create(config, smp::ProcessEnv::from_environment(), {argv[1]});
    const int64_t rows = rt->config().get_int("train.batch_size"), len = rt->config().get_int("model.seq_len");
    std::ifstream in(argv[3]);
    const std::vector<int64_t> ids{std::istream_iterator<int64_t>(in), std::istream_iterator<int64_t>()};
    if (static_cast<int64_t>(ids.size()) != rows * (len + 1)) {
      std::cerr << "smp_hf_eval: " << argv[3] << " holds " << ids.size() << " ids, not " << rows << " x " << len + 1
                << "\n";
      return 2;
    }
    const at::Tensor all = at::tensor(ids, at::kLong).view({rows, len + 1});
    const at::Tensor tokens = all.narrow(1, 0, len).contiguous(), targets = all.narrow(1, 1, len).contiguous();
    const double loss = rt->evaluate(smp::Batch{{"tokens", tokens}, {"targets", targets}});
    const at::Tensor logits = rt->forward(smp::Batch{{"tokens", tokens}}, {"logits"}).at("logits");
    const at::Tensor head = logits.to(at::kDouble).contiguous();
    std::vector<double> values(head.data_ptr<double>(), head.data_ptr<double>() + head.numel());
    std::cout << nlohmann::json{{"loss", loss}, {"logits", values}, {"shape", logits.sizes().vec()}}.dump() << "\n";
    rt->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "smp_hf_eval: " << e.what() << "\n";
    return 1;
  }
}
