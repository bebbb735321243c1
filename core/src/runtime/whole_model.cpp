#include "runtime/whole_model.h"

#include <smp/error.h>

#include "comm/communicator.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>

namespace smp {

namespace {

constexpr const char* kPrefix = "model/";

struct Shape {
  std::vector<int64_t> global;
  at::ScalarType dtype;
};

// Every rank's {name: [shape, dtype]} of its model entries, merged: a rank
// knows only the parameters of its own stages.
std::map<std::string, Shape> all_shapes(const std::vector<StateEntry>& entries, Communicator& world) {
  nlohmann::json mine = nlohmann::json::object();
  for (const StateEntry& e : entries)
    if (e.name.rfind(kPrefix, 0) == 0)
      mine[e.name.substr(6)] =
          nlohmann::json::array({nlohmann::json(e.global_shape), static_cast<int>(e.local.scalar_type())});
  const std::string text = mine.dump();
  // The texts' lengths, then the texts padded to the longest (one byte per int64).
  at::Tensor length = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  at::Tensor lengths = at::empty({world.size()}, at::kLong);
  world.allgather(length, lengths)->wait();
  const int64_t longest = lengths.max().item<int64_t>();
  at::Tensor bytes = at::zeros({longest}, at::kLong);
  for (size_t i = 0; i < text.size(); ++i) bytes[static_cast<int64_t>(i)] = static_cast<unsigned char>(text[i]);
  at::Tensor all = at::empty({world.size() * longest}, at::kLong);
  world.allgather(bytes, all)->wait();
  std::map<std::string, Shape> out;
  const int64_t* p = all.data_ptr<int64_t>();
  for (int r = 0; r < world.size(); ++r) {
    std::string t(static_cast<size_t>(lengths[r].item<int64_t>()), '\0');
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<char>(p[r * longest + static_cast<int64_t>(i)]);
    const nlohmann::json theirs = nlohmann::json::parse(t);  // kept: items() refers to it
    for (const auto& [name, v] : theirs.items())
      out[name] = {v.at(0).get<std::vector<int64_t>>(), static_cast<at::ScalarType>(v.at(1).get<int>())};
  }
  return out;
}

// An owner's slice written into the zeros of the whole tensor.
void place(const StateEntry& e, at::Tensor& whole) {
  at::Tensor block = whole;
  for (size_t d = 0; d < e.offsets.size(); ++d)
    block = block.narrow(static_cast<int64_t>(d), e.offsets[d], e.block_shape[d]);
  const at::Tensor local = e.local.detach().to(whole.device(), whole.scalar_type());
  if (e.flat_begin < 0) {
    block.copy_(local.reshape(block.sizes()));
    return;
  }
  at::Tensor flat = block.contiguous();
  flat.view(-1).narrow(0, e.flat_begin, local.numel()).copy_(local.reshape(-1));
  block.copy_(flat);
}

}  // namespace

std::vector<std::pair<std::string, at::Tensor>> whole_model(const std::vector<StateEntry>& entries, Communicator& world,
                                                            const c10::Device& device) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, shape] : all_shapes(entries, world)) {
    // Zeros everywhere but the owners' slices: exactly one owner per element,
    // so the sum over the world is each value unchanged.
    at::Tensor whole = at::zeros(shape.global, at::TensorOptions().dtype(shape.dtype).device(device));
    for (const StateEntry& e : entries)
      if (e.owner && e.name.size() > 6 && e.name.compare(0, 6, kPrefix) == 0 && e.name.compare(6, std::string::npos, name) == 0)
        place(e, whole);
    world.allreduce(whole)->wait();
    out.emplace_back(name, whole);
  }
  return out;
}

}  // namespace smp
