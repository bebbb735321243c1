// The checkpoint manifest (core/src/checkpoint/checkpoint.cpp read_manifest,
// manifest_check.cpp check_manifest): the input is manifest.json of a real
// two-rank checkpoint folder written once at start by CheckpointWriter, so a
// manifest that passes the checks is then verified (verify_checkpoint) and
// loaded (read_global_tensor, load_entries) against real shards, as
// `smp-checkpoint verify/export` and a resumed job would.
#include "support/fuzz_target.h"

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>

#include <fstream>
#include <sstream>

namespace {

// A layout's entries for rank `rank` of 2: a row-split matrix, a ZeRO-style
// flat slice of a moment, a whole bf16 vector and a counter on rank 0.
std::vector<smp::StateEntry> entries(int rank) {
  std::vector<smp::StateEntry> out;
  smp::StateEntry w;
  w.name = "model/w";
  w.global_shape = {4, 3};
  w.offsets = {2 * rank, 0};
  w.block_shape = {2, 3};
  w.local = at::arange(6 * rank, 6 * rank + 6, at::kFloat).view({2, 3});
  w.owner = true;
  out.push_back(w);
  smp::StateEntry m;
  m.name = "optim/exp_avg/model/w";
  m.global_shape = {4, 3};
  m.offsets = {0, 0};
  m.block_shape = {4, 3};
  m.flat_begin = 6 * rank;
  m.local = at::full({6}, 0.5 + rank, at::kFloat);
  m.owner = true;
  out.push_back(m);
  if (rank == 0) {
    smp::StateEntry b = smp::whole_tensor_entry("model/b", at::ones({3}, at::kBFloat16));
    out.push_back(b);
    smp::StateEntry step;
    step.name = "step";
    step.local = at::scalar_tensor(7, at::kLong);
    step.owner = true;
    out.push_back(step);
  }
  return out;
}

struct Checkpoint {
  std::string folder, manifest;
};

// Written once per process: the shards stay, manifest.json is each input.
const Checkpoint& checkpoint() {
  static const Checkpoint c = [] {
    Checkpoint out;
    out.folder = smp::fuzz::work_dir() + "/step-00000007";
    for (int rank : {1, 0}) {  // rank 0 commits once rank 1's part is there
      smp::CheckpointWriter w({rank, 2, 30.0, 0x5eedULL});
      w.save(out.folder, entries(rank), {{"step", 7}}, false, 0, false);
    }
    std::ifstream in(out.folder + "/manifest.json");
    std::ostringstream s;
    s << in.rdbuf();
    out.manifest = s.str();
    // SMP_FUZZ_SEED_OUT: where to put the real manifest as a seed (fuzz/make_corpus.py).
    if (const char* seed = std::getenv("SMP_FUZZ_SEED_OUT"); seed && *seed) smp::fuzz::write_file(seed, out.manifest);
    return out;
  }();
  return c;
}

// One step of the load; its refusal does not stop the next.
template <class F>
void attempt(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    smp::fuzz::refused(e.what());
  }
}

}  // namespace

SMP_FUZZ_TARGET(manifest) {
  const Checkpoint& c = checkpoint();
  smp::fuzz::write_file(c.folder + "/manifest.json", std::string_view(reinterpret_cast<const char*>(data), size));
  const nlohmann::json m = smp::read_manifest(c.folder);
  attempt([&] { smp::verify_checkpoint(c.folder, m); });
  int tried = 0;
  for (const auto& item : m["tensors"].items()) {
    if (++tried > 8) break;
    attempt([&] {
      const std::string dtype = item.value()["dtype"].get<std::string>();
      smp::read_global_tensor(c.folder, m, item.key(), smp::scalar_type_of(dtype));
    });
  }
  // Another layout's rank: rows 1-2 of the matrix, a flat slice across both
  // ranks' slices, the counter; with same_model the padding path too.
  for (bool same_model : {false, true}) {
    attempt([&] {
      smp::StateEntry w;
      w.name = "model/w";
      w.global_shape = {4, 3};
      w.offsets = {1, 0};
      w.block_shape = {2, 3};
      w.local = at::zeros({2, 3}, at::kFloat);
      smp::StateEntry f;
      f.name = "optim/exp_avg/model/w";
      f.global_shape = {4, 3};
      f.offsets = {0, 0};
      f.block_shape = {4, 3};
      f.flat_begin = 3;
      f.local = at::zeros({5}, at::kFloat);
      smp::StateEntry step;
      step.name = "step";
      step.local = at::scalar_tensor(0, at::kLong);
      smp::load_entries(c.folder, m, {w, f, step}, same_model);
    });
  }
}
