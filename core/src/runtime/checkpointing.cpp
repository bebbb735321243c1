#include "runtime/checkpointing.h"

#include <smp/error.h>
#include <smp/mesh.h>
#include <smp/plugin_registry.h>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "runtime/memory_snapshot.h"
#include "runtime/model_plan.h"
#include "runtime/parallel_context.h"
#include "runtime/train_state.h"

#include <spdlog/spdlog.h>

#include <ATen/ATen.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

namespace smp {

namespace {

// A checkpoint this run may take values from: its folder and manifest, and the
// keys of [model] that differ from this run's ("" when the tables agree; then a
// tensor whose shape differs can only be the layout's vocabulary padding).
// Manifests written by `smp-checkpoint import` have no [model] or layout.
struct OpenedCheckpoint {
  std::string folder;
  nlohmann::json manifest;
  std::string changed;
};

// require_adapter: a checkpoint that names no adapter is refused too (a resume
// needs the whole state of this adapter; run.init_from takes imported files).
OpenedCheckpoint open_checkpoint(const std::string& path, const std::string& what, const std::string& adapter,
                                 bool require_adapter, const nlohmann::json& model) {
  OpenedCheckpoint c;
  c.folder = find_checkpoint(path);
  if (c.folder.empty()) throw Error(what + ": '" + path + "' is not a checkpoint folder nor holds a `latest` one");
  c.manifest = read_manifest(c.folder);
  const std::string saved = c.manifest.value("/adapter/name"_json_pointer, std::string());
  if ((require_adapter || !saved.empty()) && saved != adapter)
    throw Error(what + ": checkpoint " + c.folder + " was saved by adapter '" + saved + "', this run's is '" +
                adapter + "'");
  const nlohmann::json was = c.manifest.value("model", nlohmann::json());
  if (!was.is_object()) {
    c.changed = "(not recorded)";
    return c;
  }
  for (const auto& [k, v] : model.items())
    if (!was.contains(k) || was[k] != v) c.changed += (c.changed.empty() ? "" : ", ") + ("model." + k);
  for (const auto& [k, v] : was.items())
    if (!model.contains(k)) c.changed += (c.changed.empty() ? "" : ", ") + ("model." + k);
  return c;
}

// Rank 0's answer, on every rank: `choose` runs on rank 0 only and what it
// returns (or the smp::Error it throws, thrown on every rank) reaches all.
// Ranks that each looked for the newest checkpoint themselves could resume
// different steps: a save committing between their looks, or node-local
// folders holding different checkpoints.
std::string rank0_choice(Communicator& world, const std::function<std::string()>& choose) {
  std::string text;
  bool failed = false;
  if (world.rank() == 0) {
    try {
      text = choose();
    } catch (const Error& e) {
      text = e.what();
      failed = true;
    }
  }
  at::Tensor header = at::zeros({2}, at::kLong);
  if (world.rank() == 0) {
    header[0] = failed ? 1 : 0;
    header[1] = static_cast<int64_t>(text.size());
  }
  world.broadcast(header, 0)->wait();
  at::Tensor bytes = at::zeros({header[1].item<int64_t>()}, at::kLong);
  int64_t* b = bytes.data_ptr<int64_t>();
  if (world.rank() == 0) std::copy(text.begin(), text.end(), b);  // chars as their values
  world.broadcast(bytes, 0)->wait();
  if (world.rank() != 0) text.assign(b, b + bytes.numel());
  if (header[0].item<int64_t>() != 0) throw Error(text);
  return text;
}

}  // namespace

Checkpointing::Checkpointing(const JobConfig& job, const ParallelContext& context, const ModelPlan& model,
                             TrainState& state, uint64_t token)
    : job_(job), context_(context), model_(model), state_(state) {
  CheckpointWriter::Options o;
  o.rank = context.mesh().rank();
  o.world = context.mesh().world_size();
  o.timeout_s = job.run.timeout_s;
  o.token = token;
  if (context.joined()) o.rendezvous = context.shared_rendezvous();
  writer_ = std::make_unique<CheckpointWriter>(o);
  if (job.run.snapshot_every > 0)
    snapshot_ = std::make_unique<MemorySnapshot>(job, context.comm(Role::World), dir());
}

void Checkpointing::save_snapshot() {
  if (!snapshot_) return;
  writer_->wait_for_snapshot();
  snapshot_->save(state_.steps(), state_.entries(), info());
}

void Checkpointing::remove_snapshots() {
  if (snapshot_) snapshot_->remove_local();
}

Checkpointing::~Checkpointing() = default;

// What a checkpoint's manifest says besides its tensors.
nlohmann::json Checkpointing::info() const {
  const DeviceMesh& mesh = context_.mesh();
  nlohmann::json layout = {{"pp", mesh.pp()},
                           {"tp", mesh.tp()},
                           {"dp", mesh.dp()},
                           {"ep", mesh.ep()},
                           {"world", mesh.world_size()},
                           {"placement", mesh.order()},
                           {"zero", job_.memory.zero},
                           {"virtual_stages", job_.parallel.virtual_stages},
                           {"precision", to_string(job_.train.precision)}};
  // Every axis by name: its size and role (a derived one also the dimensions it
  // is made of); the tensors' slices follow from their placements alone. The
  // counts above stay for readers of the manifests written before roles.
  const MeshSpec& spec = mesh.spec();
  for (const Axis& a : mesh.axes()) {
    nlohmann::json& r = layout["roles"][a.name()];
    r = {{"size", mesh.size(a)}, {"role", to_string(mesh.role_of(a))}};
    for (const MeshDerived& d : spec.derived())
      if (d.name == a.name()) r["parts"] = d.parts;
  }
  std::string version;
  for (const auto& p : model_.registry().plugins())
    if (p.name == model_.adapter().plugin()) version = p.version;
  nlohmann::json nodes = nlohmann::json::array();  // what tools need to name the tensors (smp-checkpoint export)
  for (const auto& n : model_.graph().nodes)
    nodes.push_back({{"name", n.name}, {"kind", n.kind}, {"config", nlohmann::json::parse(n.config_json)}});
  // The launch's round (smp-launch's restart or re-formation count): a
  // commit of an earlier round, still running on a machine the job lost,
  // does not move `latest` back past a later round's (checkpoint.cpp).
  const char* restarts = std::getenv("SMP_RESTART_COUNT");
  const int64_t round = restarts && *restarts ? std::atoll(restarts) : 0;
  return {{"step", state_.steps()},
          {"round", round},
          {"graph", nodes},
          {"adapter", {{"name", model_.adapter().name()}, {"plugin", model_.adapter().plugin()}, {"version", version}}},
          {"model", job_.model},
          {"layout", layout},
          {"config", job_.source->to_json()},
          {"seed", job_.train.seed},
          {"smp_version", SMP_VERSION},
          {"torch_version", SMP_BUILD_TORCH_VERSION}};
}

void Checkpointing::save(const std::string& path) {
  writer_->save(path, state_.entries(), info(), /*async=*/false, /*keep=*/0, /*update_latest=*/false);
}

std::string Checkpointing::dir() const {
  const RunConfig& run = job_.run;
  return run.checkpoint_dir.empty() ? (boost::filesystem::path(run.dir) / "checkpoints").string() : run.checkpoint_dir;
}

void Checkpointing::save_step() {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(state_.steps()));
  const std::string path = (boost::filesystem::path(dir()) / name).string();
  writer_->save(path, state_.entries(), info(), job_.run.checkpoint_async, job_.run.keep_checkpoints,
                /*update_latest=*/true);
}

void Checkpointing::load(const std::string& path) {
  writer_->wait_for_snapshot();
  const OpenedCheckpoint c = open_checkpoint(path, "checkpoint", model_.adapter().name(), true, job_.model);
  try {
    state_.load_with(
        [&](const std::vector<StateEntry>& live) { load_entries(c.folder, c.manifest, live, c.changed.empty()); });
  } catch (const Error& e) {
    if (c.changed.empty()) throw;
    throw Error(std::string(e.what()) + "; the checkpoint's [model] differs in " + c.changed);
  }
  if (context_.mesh().rank() != 0) return;
  const nlohmann::json l = c.manifest.value("layout", nlohmann::json::object());
  spdlog::info("loaded checkpoint {} (step {}, saved at pp={} tp={} dp={} zero {}, {})", c.folder,
               c.manifest.value("step", int64_t{0}), l.value("pp", 0), l.value("tp", 0), l.value("dp", 0),
               l.value("zero", 0), l.value("precision", "?"));
  if (!c.changed.empty()) spdlog::warn("checkpoint {}: [model] differs in {}", c.folder, c.changed);
  const auto saved_seed = c.manifest.value("seed", job_.train.seed);
  if (saved_seed != job_.train.seed)
    spdlog::warn("checkpoint {} was saved with train.seed = {}, this run has {}: data order and dropout differ",
                 c.folder, saved_seed, job_.train.seed);
}

std::string Checkpointing::resume() {
  const std::string folder = resume_checkpoint(job_.run.resume);
  if (folder.empty() && !job_.run.init_from.empty()) init_from(job_.run.init_from);
  return folder;
}

ResumePoint Checkpointing::resume_if_asked(bool asked) {
  ResumePoint r;
  const auto start = std::chrono::steady_clock::now();
  r.folder = resume_checkpoint(asked ? job_.run.resume : "never");
  if (r.folder.empty()) {
    if (!job_.run.init_from.empty()) init_from(job_.run.init_from);
    return r;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.step = state_.steps();
  if (context_.mesh().rank() == 0)
    spdlog::warn("resumed from {} (run.resume = \"{}\"): {} steps are done; training goes on from step {} "
                 "(Runtime::steps_done() = {})", r.folder, job_.run.resume, r.step, r.step + 1, r.step);
  return r;
}

std::string Checkpointing::resume_checkpoint(const std::string& mode) {
  if (mode == "never") return "";
  // Rank 0 picks the checkpoint; every rank loads that one.
  const bool newest = mode == "auto" || mode == "latest";
  std::string folder = rank0_choice(context_.comm(Role::World), [&]() -> std::string {
    if (newest) {
      const std::string found = find_checkpoint(dir());
      if (found.empty() && mode == "latest" && !snapshot_)
        throw Error("run.resume = \"latest\": no checkpoint in " + dir() + " (no `latest` there)");
      return found;
    }
    const std::string found = find_checkpoint(mode);
    if (found.empty()) throw Error("run.resume: '" + mode + "' is not a checkpoint folder nor holds a `latest` one");
    return found;
  });
  // A memory snapshot newer than the checkpoint on disk, whole between the
  // machines: that one, reading no disk (each machine's own copy).
  if (newest && snapshot_) {
    const std::string step_text = rank0_choice(context_.comm(Role::World), [&]() -> std::string {
      return folder.empty() ? "-1" : std::to_string(read_manifest(folder).value("step", int64_t{-1}));
    });
    const std::string memory = snapshot_->gather_newest(std::stoll(step_text));
    if (!memory.empty()) {
      load(memory);
      return memory;
    }
    if (folder.empty() && mode == "latest")
      throw Error("run.resume = \"latest\": no checkpoint in " + dir() + " (no `latest` there) and no memory snapshot "
                  "whole between the machines (run.snapshot_dir " + job_.run.snapshot_dir + ")");
  }
  if (folder.empty()) return "";
  if (!boost::filesystem::is_directory(folder))
    throw Error("run.resume: rank " + std::to_string(context_.mesh().rank()) + " cannot see checkpoint " + folder +
                ", which rank 0 chose: every rank must read the same checkpoint folder (a shared file system)");
  load(folder);
  return folder;
}

void Checkpointing::init_from(const std::string& path) {
  writer_->wait_for_snapshot();
  const OpenedCheckpoint c = open_checkpoint(path, "run.init_from", model_.adapter().name(), false, job_.model);
  state_.load_with([&](const std::vector<StateEntry>& live) {
    std::vector<StateEntry> parameters;
    for (const auto& e : live)
      if (e.name.rfind("model/", 0) == 0 || e.name.rfind("optim/master/", 0) == 0) parameters.push_back(e);
    load_entries(c.folder, c.manifest, parameters, c.changed.empty());
  });
  if (context_.mesh().rank() == 0) spdlog::info("parameters from {} (run.init_from)", c.folder);
}

}  // namespace smp
