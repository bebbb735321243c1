#include "checkpoint/checkpoint.h"

#include "checkpoint/manifest_check.h"

#include "base/json_depth.h"

#include "checkpoint/crc32c.h"
#include "checkpoint/safetensors.h"
#include "comm/communicator.h"
#include "comm/wait.h"

#include <smp/error.h>
#include <smp/process_env.h>

#include <ATen/ATen.h>
#include <boost/filesystem.hpp>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

namespace smp {

namespace fs = boost::filesystem;

namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

std::string rank_name(int rank, const char* ext) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "rank-%05d.%s", rank, ext);
  return buf;
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error("checkpoint: cannot open " + path + " to fsync it");
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error("checkpoint: fsync of " + path + " failed");
}

// Written under a temporary name, fsynced, renamed into place: a reader sees
// the old file or the whole new one.
void write_file_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    // POSIX writes, so that the failure names its cause (ENOSPC: "No space left on device").
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) throw Error("checkpoint: cannot create " + tmp.string() + ": " + std::strerror(errno));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = n < 0 ? std::strerror(errno) : "nothing written";
        ::close(fd);
        throw Error("checkpoint: writing " + tmp.string() + " failed: " + why);
      }
      done += static_cast<size_t>(n);
    }
    if (::close(fd) != 0) throw Error("checkpoint: closing " + tmp.string() + " failed: " + std::strerror(errno));
  }
  fsync_path(tmp.string());
  fs::rename(tmp, path);
  fsync_path(path.parent_path().string());
}

// A manifest (or a rank's part of one): a regular file, bounded; a manifest
// of 10^5 tensors sliced over 1024 ranks stays well under the bound.
nlohmann::json read_json(const fs::path& path) {
  std::string text;
  try {
    text = input::read_file(path.string(), "checkpoint", 1024 * input::kMiB);
  } catch (const input::Error& e) {
    throw Error(e.what());
  }
  return parse_json_bounded(text, "checkpoint: " + path.string());
}

std::string token_hex(uint64_t token) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(token));
  return buf;
}

// "step-00000100" -> 100; -1 for other names.
int64_t step_of_folder(const std::string& name) {
  static const std::regex re("step-([0-9]+)");
  std::smatch m;
  return std::regex_match(name, m, re) ? std::stoll(m[1].str()) : -1;
}

// Renamed out of the checkpoint names first: a deletion cut short by a crash
// leaves a folder no reader takes for a checkpoint.
void remove_folder(const fs::path& folder, const std::string& token) {
  const fs::path doomed = folder.string() + ".deleting-" + token;
  fs::rename(folder, doomed);
  fsync_path(folder.parent_path().string());
  fs::remove_all(doomed);
}

nlohmann::json slice_json(const StateEntry& e) {
  nlohmann::json s = {{"offsets", e.offsets}, {"block_shape", e.block_shape}, {"flat_begin", e.flat_begin},
                      {"numel", e.local.numel()}};
  // DTensor-style, per axis by name and role: what a reader needs to know how the
  // slices were cut (loading reads offsets alone, so manifests without them load alike).
  for (const AxisPlacement& p : e.placements)
    s["placements"].push_back({{"axis", p.axis}, {"role", to_string(p.role)}, {"placement", to_string(p)}});
  return s;
}

}  // namespace

// ---- saving ----

struct CheckpointWriter::Job {
  fs::path target, tmp;
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // owned entries (async: live until the snapshot copies them)
  nlohmann::json slices = nlohmann::json::array();          // one per owned entry
  nlohmann::json info;
  int keep = 0;
  bool update_latest = false;
  clock_type::time_point start;
  std::string parts_written;  // the rendezvous barrier every rank arrives at once its part is on disk
};

CheckpointWriter::CheckpointWriter(Options o) : o_(o) {}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
  }
}

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void CheckpointWriter::save(const std::string& path, const std::vector<StateEntry>& entries, const nlohmann::json& info,
                            bool async, int keep, bool update_latest) {
  // Counted before anything can throw (wait() rethrows an earlier save's
  // failure): a rank whose program goes on after that error must still name
  // its later saves as the other ranks do.
  const uint64_t save_number = ++saves_;
  wait();
  auto job = std::make_shared<Job>();
  job->start = clock_type::now();
  // "ckpt/" means the folder ckpt: its temporary sibling is ckpt.tmp-*, not ckpt/.tmp-*.
  std::string folder = path;
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  job->target = fs::absolute(fs::path(folder));
  job->tmp = job->target.string() + ".tmp-" + token_hex(o_.token);
  job->info = info;
  job->keep = keep;
  job->update_latest = update_latest;
  // Every rank saves the same checkpoints in the same order: the count and
  // the folder's name (not its path: mounts may differ between nodes) name the
  // save alike on all; a rank saving another folder is missing.
  job->parts_written =
      "checkpoint/" + token_hex(o_.token) + "/" + std::to_string(save_number) + "/" + job->target.filename().string();
  for (const StateEntry& e : entries) {
    if (!e.owner) continue;
    // Synchronously: the live tensor itself where it is on the host already.
    // In the background: the live tensor, copied by the writer thread before
    // anything changes it (wait_for_snapshot).
    at::Tensor t = async ? e.local.detach() : e.local.detach().to(at::kCPU).contiguous();
    nlohmann::json s = slice_json(e);
    s["name"] = e.name;
    s["dtype"] = safetensors_dtype(t.scalar_type());
    s["global_shape"] = e.global_shape;
    job->slices.push_back(s);
    job->tensors.emplace_back(e.name, t);
  }
  bytes_ = 0;
  if (async) {
    std::vector<at::Tensor> live;
    for (auto& [name, t] : job->tensors) live.push_back(t);
    snapshot_.mark(live);
    {
      std::lock_guard<std::mutex> lock(snapshot_mutex_);
      snapshot_pending_ = true;
    }
    thread_ = std::thread([this, job] {
      try {
        // The copies first, at normal priority: the next step's forward and
        // backward only read what is copied, its update waits for them. From a
        // GPU on a side stream into pinned memory (host_snapshot.h).
        std::vector<at::Tensor> live;
        for (auto& [name, t] : job->tensors) live.push_back(t);
        std::vector<at::Tensor> copies = snapshot_.copy(live);
        for (size_t i = 0; i < copies.size(); ++i) job->tensors[i].second = copies[i];
      } catch (...) {
        error_ = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(snapshot_mutex_);
        snapshot_pending_ = false;
      }
      snapshot_done_.notify_all();
      if (error_) return;
      // Then the writing, taking the CPU only when training leaves it idle:
      // on a machine whose cores the ranks keep busy it must not slow the steps.
      sched_param lowest{};
      pthread_setschedparam(pthread_self(), SCHED_IDLE, &lowest);
      try {
        run(job);
      } catch (...) {
        error_ = std::current_exception();
      }
    });
    blocking_s_ = seconds_since(job->start);
  } else {
    run(job);
    blocking_s_ = seconds_since(job->start);  // a synchronous save blocks for all of it
  }
}

void CheckpointWriter::wait_for_snapshot() {
  std::unique_lock<std::mutex> lock(snapshot_mutex_);
  snapshot_done_.wait(lock, [this] { return !snapshot_pending_; });
}

namespace {

// Every rank's index of its part in the temporary folder, read once every
// rank has said (through the rendezvous) that its part is on disk: a file
// missing then is on a file system this rank does not share.
std::vector<nlohmann::json> read_parts(const fs::path& tmp, const fs::path& target, int world) {
  std::vector<nlohmann::json> parts(world);
  std::string missing;
  // A shared file system may show another node's new file a little late
  // (NFS's attribute cache holds for seconds): a missing part is looked for
  // again for a bounded while before the save is refused.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (int r = 0; r < world; ++r) {
    const fs::path p = tmp / rank_name(r, "json");
    while (!fs::exists(p) && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (fs::exists(p))
      parts[r] = read_json(p);
    else
      missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!missing.empty())
    throw Error("checkpoint: ranks " + missing + " wrote their part of " + target.string() +
                " but rank 0 finds none in " + tmp.string() +
                " (is run.checkpoint_dir on a file system every node shares?)");
  return parts;
}

// The manifest's files and tensors from the ranks' indexes; a tensor's slices
// must agree on its dtype and global shape.
void merge_parts(const std::vector<nlohmann::json>& parts, nlohmann::json& files, nlohmann::json& tensors) {
  for (const auto& part : parts) {
    if (!part.contains("file")) continue;
    const std::string file = part["file"]["name"].get<std::string>();
    files.push_back({{"name", file}, {"rank", part["rank"]}, {"bytes", part["file"]["bytes"]},
                     {"crc32c", part["file"]["crc32c"]}});
    for (const auto& s : part["slices"]) {
      const std::string name = s["name"].get<std::string>();
      nlohmann::json& t = tensors[name];
      if (t.is_null()) t = {{"dtype", s["dtype"]}, {"shape", s["global_shape"]}, {"slices", nlohmann::json::array()}};
      if (s.contains("placements") && !t.contains("placements")) t["placements"] = s["placements"];
      if (t["dtype"] != s["dtype"] || t["shape"] != s["global_shape"])
        throw Error("checkpoint: ranks disagree on tensor '" + name + "': " + t["dtype"].dump() + t["shape"].dump() +
                    " and " + s["dtype"].dump() + s["global_shape"].dump());
      t["slices"].push_back({{"file", file},
                             {"offsets", s["offsets"]},
                             {"block_shape", s["block_shape"]},
                             {"flat_begin", s["flat_begin"]},
                             {"numel", s["numel"]},
                             {"crc32c", s["crc32c"]}});
    }
  }
}

// The committed folder into place. A folder of the same name (the step saved
// again) is swapped with the new one in one step where the file system can
// (renameat2's RENAME_EXCHANGE), else moved aside first; it goes once the new one is in.
void move_into_place(const fs::path& tmp, const fs::path& target, const std::string& token) {
  const fs::path parent = target.parent_path();
  if (fs::exists(target)) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
      fsync_path(parent.string());
      remove_folder(tmp, token);
    } else {
      const fs::path replaced = target.string() + ".old-" + token;
      fs::remove_all(replaced);
      fs::rename(target, replaced);
      fs::rename(tmp, target);
      fsync_path(parent.string());
      remove_folder(replaced, token);
    }
  } else {
    fs::rename(tmp, target);
    fsync_path(parent.string());
  }
}

// Keeps the newest `keep` committed step-* folders of `parent` (never `target`)
// and removes what crashed attempts of other runs left there.
void prune_checkpoints(const fs::path& parent, int keep, const fs::path& target, const std::string& token) {
  std::vector<std::pair<int64_t, fs::path>> committed;
  for (const auto& d : fs::directory_iterator(parent)) {
    const std::string name = d.path().filename().string();
    const int64_t step = step_of_folder(name);
    if (step >= 0 && fs::exists(d.path() / "manifest.json")) committed.emplace_back(step, d.path());
    // What an earlier attempt (another token) left when it crashed: a
    // temporary folder, or one it was deleting.
    else if (name.rfind("step-", 0) == 0 && name.find(token) == std::string::npos &&
             (name.find(".tmp-") != std::string::npos || name.find(".deleting-") != std::string::npos ||
              name.find(".old-") != std::string::npos))
      fs::remove_all(d.path());
  }
  std::sort(committed.begin(), committed.end());
  const int drop = static_cast<int>(committed.size()) - keep;
  for (int i = 0; i < drop; ++i)
    if (committed[i].second != target) remove_folder(committed[i].second, token);
}

}  // namespace

void CheckpointWriter::run(const std::shared_ptr<Job>& job) {
  const fs::path& tmp = job->tmp;
  try {
    fs::create_directories(tmp);
  } catch (const std::exception& e) {
    throw Error("checkpoint: cannot create " + tmp.string() + ": " + e.what());
  }
  for (size_t i = 0; i < job->tensors.size(); ++i) {  // here, not in save(): off the step's path
    const at::Tensor& t = job->tensors[i].second;
    job->slices[i]["crc32c"] = crc32c(0, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  }
  nlohmann::json index = {{"rank", o_.rank}, {"slices", job->slices}};
  if (!job->tensors.empty()) {
    const std::string file = rank_name(o_.rank, "safetensors");
    const SafetensorsWritten w = write_safetensors((tmp / file).string(), job->tensors,
                                                   {{"format", "smp-checkpoint"}, {"rank", std::to_string(o_.rank)}});
    index["file"] = {{"name", file}, {"bytes", w.bytes}, {"crc32c", w.crc32c}};
    bytes_ = w.bytes;
  }
  // This rank's part is on disk: its index says so (renamed into place last),
  // and the rendezvous tells rank 0.
  write_file_atomic(tmp / rank_name(o_.rank, "json"), index.dump());
  if (o_.world > 1) {
    if (!o_.rendezvous)
      throw Error("internal: a checkpoint of " + std::to_string(o_.world) + " ranks needs the job's rendezvous");
    o_.rendezvous->arrive(job->parts_written);
  }
  if (o_.rank != 0) {
    total_s_ = seconds_since(job->start);
    return;
  }

  // Rank 0 commits once every rank's part is there.
  if (o_.world > 1) wait_for_parts(job->parts_written, job->target.string());
  const std::vector<nlohmann::json> parts = read_parts(tmp, job->target, o_.world);
  nlohmann::json files = nlohmann::json::array(), tensors = nlohmann::json::object();
  merge_parts(parts, files, tensors);
  nlohmann::json manifest = job->info;
  manifest["format"] = "smp-checkpoint";
  manifest["version"] = kCheckpointFormatVersion;
  manifest["files"] = files;
  manifest["tensors"] = tensors;
  write_file_atomic(tmp / "manifest.json", manifest.dump(1));
  for (int r = 0; r < o_.world; ++r) fs::remove(tmp / rank_name(r, "json"));
  fsync_path(tmp.string());

  move_into_place(tmp, job->target, token_hex(o_.token));
  const fs::path parent = job->target.parent_path();
  // A later round of the job (an elastic re-formation, a restart) has
  // committed already: this save of an earlier round, still running on a
  // machine the job lost, is left where it is and `latest` stays.
  int64_t later_round = -1;
  if (job->update_latest && job->info.is_object() && job->info.contains("round")) {
    try {
      const std::string current = find_checkpoint(parent.string());
      if (!current.empty()) later_round = read_manifest(current).value("round", int64_t{0});
    } catch (const std::exception&) {
      // an unreadable `latest` is replaced, as before
    }
  }
  const int64_t my_round = job->info.is_object() ? job->info.value("round", int64_t{0}) : 0;
  if (job->update_latest && later_round > my_round) {
    spdlog::warn("checkpoint {}: round {} of the job has committed since; this save of round {} leaves `latest` "
                 "as it is", job->target.string(), later_round, my_round);
  } else if (job->update_latest) {
    write_file_atomic(parent / "latest", job->target.filename().string() + "\n");
    // smp-launch learns the step a restart would resume from (one short line: atomic on its pipe).
    int64_t step = step_of_folder(job->target.filename().string());
    if (step < 0 && job->info.is_object() && job->info.contains("step") && job->info["step"].is_number_integer())
      step = job->info["step"].get<int64_t>();
    if (step >= 0) notify_launcher("committed " + std::to_string(step));
  }

  if (job->keep > 0) prune_checkpoints(parent, job->keep, job->target, token_hex(o_.token));
  total_s_ = seconds_since(job->start);
  int64_t bytes = 0;
  for (const auto& f : files) bytes += f["bytes"].get<int64_t>();
  bytes_ = bytes;
  spdlog::info("checkpoint {}: {} tensors, {:.1f} MB in {} files, committed {:.2f} s after the step", job->target.string(),
               tensors.size(), static_cast<double>(bytes) / 1e6, files.size(), total_s_);
}

void CheckpointWriter::wait_for_parts(const std::string& barrier, const std::string& target) const {
  try {
    o_.rendezvous->wait_for_all(barrier, std::chrono::milliseconds(static_cast<int64_t>(o_.timeout_s * 1000)),
                                "every rank's part of " + target);
  } catch (const WaitFailed& f) {
    std::ostringstream timeout;
    timeout << o_.timeout_s;
    throw WaitFailed(f.why(), "checkpoint: " + std::string(f.what()) + " (run.timeout_s = " + timeout.str() + " s)");
  }
}

// ---- finding and reading ----

// ---- the pieces, for checkpoints kept elsewhere (runtime/memory_snapshot.h) ----

nlohmann::json write_checkpoint_part(const std::string& folder, int rank, const std::vector<StateEntry>& entries) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  nlohmann::json slices = nlohmann::json::array();
  for (const StateEntry& e : entries) {
    if (!e.owner) continue;
    const at::Tensor t = e.local.detach().to(at::kCPU).contiguous();
    nlohmann::json s = slice_json(e);
    s["name"] = e.name;
    s["dtype"] = safetensors_dtype(t.scalar_type());
    s["global_shape"] = e.global_shape;
    s["crc32c"] = crc32c(0, t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
    slices.push_back(s);
    tensors.emplace_back(e.name, t);
  }
  nlohmann::json index = {{"rank", rank}, {"slices", slices}};
  if (!tensors.empty()) {
    const std::string file = rank_name(rank, "safetensors");
    const SafetensorsWritten w = write_safetensors((fs::path(folder) / file).string(), tensors,
                                                   {{"format", "smp-checkpoint"}, {"rank", std::to_string(rank)}});
    index["file"] = {{"name", file}, {"bytes", w.bytes}, {"crc32c", w.crc32c}};
  }
  return index;
}

void write_checkpoint_manifest(const std::string& folder, const std::vector<nlohmann::json>& parts,
                               const nlohmann::json& info) {
  nlohmann::json files = nlohmann::json::array(), tensors = nlohmann::json::object();
  merge_parts(parts, files, tensors);
  nlohmann::json manifest = info;
  manifest["format"] = "smp-checkpoint";
  manifest["version"] = kCheckpointFormatVersion;
  manifest["files"] = files;
  manifest["tensors"] = tensors;
  write_file_atomic(fs::path(folder) / "manifest.json", manifest.dump(1));
}

std::string find_checkpoint(const std::string& path) {
  const fs::path p(path);
  if (fs::exists(p / "manifest.json")) return p.string();
  if (fs::exists(p / "latest")) {
    // A line naming a folder: a regular file, bounded (a named pipe would block).
    std::string name;
    try {
      // `latest` itself under the folder's link policy: a link to a file
      // elsewhere would have its first line shown in the message below.
      name = input::read_file(input::name_in_folder(p.string(), "latest", "checkpoint: " + p.string()), "checkpoint",
                              4096);
    } catch (const input::Error& e) {
      throw Error(e.what());
    }
    name = name.substr(0, name.find('\n'));
    const fs::path folder = path_inside(p.string(), name, "checkpoint: " + (p / "latest").string());
    if (name.empty() || !fs::exists(folder / "manifest.json"))
      throw Error("checkpoint: " + (p / "latest").string() + " names '" + name + "', which is not a checkpoint in " +
                  p.string());
    return folder.string();
  }
  return "";
}

nlohmann::json read_manifest(const std::string& folder) {
  const fs::path path = fs::path(folder) / "manifest.json";
  nlohmann::json m = read_json(path);
  if (!m.is_object() || m.value("format", "") != "smp-checkpoint")
    throw Error("checkpoint: " + path.string() + " is not an smp checkpoint manifest");
  // An integer, checked before it is read as one (a float out of int's range
  // would make the conversion undefined).
  const nlohmann::json& v = m.contains("version") ? m["version"] : nlohmann::json(0);
  if (!v.is_number_integer())
    throw Error("checkpoint: " + path.string() + ": \"version\" is " + v.dump() + ", not an integer");
  const int64_t version = v.get<int64_t>();
  if (version > kCheckpointFormatVersion)
    throw Error("checkpoint: " + path.string() + " is format version " + std::to_string(version) +
                ", newer than this smp reads (" + std::to_string(kCheckpointFormatVersion) + "): upgrade smp");
  if (version < 1) throw Error("checkpoint: " + path.string() + " has no valid format version");
  check_manifest(folder, m);
  return m;
}

namespace {
int64_t elements(const std::vector<int64_t>& shape);  // below, with the loading helpers
}  // namespace

std::vector<std::string> verify_checkpoint(const std::string& folder, const nlohmann::json& manifest) {
  std::vector<std::string> problems;
  check_manifest(folder, manifest);
  std::map<std::string, double> counters;  // read from the shards that pass their checks
  for (const auto& f : manifest["files"]) {
    const fs::path path = fs::path(folder) / f["name"].get<std::string>();
    if (!fs::exists(path)) {
      problems.push_back(path.string() + ": missing");
      continue;
    }
    const int64_t bytes = f["bytes"].get<int64_t>();
    if (static_cast<int64_t>(fs::file_size(path)) != bytes) {
      problems.push_back(path.string() + ": " + std::to_string(fs::file_size(path)) + " bytes, the manifest says " +
                         std::to_string(bytes) + " (truncated?)");
      continue;
    }
    std::ifstream in(path.string(), std::ios::binary);
    std::vector<char> buf(1 << 20);
    uint32_t crc = 0;
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      crc = crc32c(crc, buf.data(), static_cast<size_t>(in.gcount()));
    }
    if (crc != f["crc32c"].get<uint32_t>()) {
      problems.push_back(path.string() + ": CRC-32C " + std::to_string(crc) + ", the manifest says " +
                         f["crc32c"].dump() + " (corrupted)");
      continue;
    }
    // Each slice the manifest puts in this file: there, with its dtype and element count.
    try {
      const SafetensorsFile shard(path.string());
      for (const auto& [name, t] : manifest["tensors"].items())
        for (const auto& sl : t["slices"]) {
          if (sl["file"] != f["name"]) continue;
          const int64_t numel = t["shape"].empty() ? 1 : sl["numel"].get<int64_t>();
          if (!shard.tensors().count(name)) {
            problems.push_back(path.string() + ": has no tensor '" + name + "', which the manifest puts there");
            continue;
          }
          const SafetensorsTensor& held = shard.at(name);
          const int64_t n = elements(held.shape);
          if (held.dtype != scalar_type_of(t["dtype"].get<std::string>()) || n != numel) {
            problems.push_back(path.string() + ": tensor '" + name + "' is " + std::to_string(n) + " elements of " +
                               c10::toString(held.dtype) + ", the manifest says " + std::to_string(numel) + " of " +
                               t["dtype"].get<std::string>());
          } else if (t["shape"].empty()) {  // a counter: its value
            at::Tensor v = at::empty({}, at::TensorOptions().dtype(held.dtype));
            shard.read(name, 0, static_cast<int64_t>(v.element_size()), v.data_ptr());
            counters[name] = v.item<double>();
          }
        }
    } catch (const Error& e) {
      problems.push_back(path.string() + ": " + e.what());
    }
  }
  try {
    check_counters("checkpoint " + folder, counters, manifest);
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
  return problems;
}

// ---- loading ----

namespace {

std::string dims(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return "[" + s + "]";
}

// The box [lo, lo + len) of `t` (a block-shaped tensor).
at::Tensor box(at::Tensor t, const std::vector<int64_t>& lo, const std::vector<int64_t>& len) {
  for (size_t d = 0; d < lo.size(); ++d) t = t.narrow(static_cast<int64_t>(d), lo[d], len[d]);
  return t;
}

int64_t flat_index(const std::vector<int64_t>& at, const std::vector<int64_t>& shape) {
  int64_t i = 0;
  for (size_t d = 0; d < shape.size(); ++d) i = i * shape[d] + at[d];
  return i;
}

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

struct FileCache {
  std::string folder;
  std::map<std::string, int64_t> bytes;  // by file name, from the manifest
  std::map<std::string, std::unique_ptr<SafetensorsFile>> open;
  const SafetensorsFile& get(const std::string& name) {
    auto& f = open[name];
    if (!f) {
      const fs::path path = fs::path(folder) / name;
      if (!fs::exists(path)) throw Error("checkpoint: shard " + path.string() + " is missing");
      const auto it = bytes.find(name);
      if (it != bytes.end() && static_cast<int64_t>(fs::file_size(path)) != it->second)
        throw Error("checkpoint: " + path.string() + " has " + std::to_string(fs::file_size(path)) +
                    " bytes, the manifest says " + std::to_string(it->second) + " (truncated or replaced)");
      f = std::make_unique<SafetensorsFile>(path.string());
    }
    return *f;
  }
};

// Every file the manifest lists, there with the size it says, before
// anything is allocated for a load: a manifest's shapes and counts are claims
// that only the files back (check_manifest bounds each file's slices by its
// size), so a damaged or hostile manifest cannot ask for more memory than the
// files hold.
void check_shards_on_disk(const std::string& folder, const nlohmann::json& manifest) {
  for (const auto& f : manifest["files"]) {
    const fs::path path = fs::path(folder) / f["name"].get<std::string>();
    boost::system::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec) throw Error("checkpoint: shard " + path.string() + " is missing");
    const int64_t claim = f["bytes"].get<int64_t>();
    if (static_cast<int64_t>(size) != claim)
      throw Error("checkpoint: " + path.string() + " has " + std::to_string(size) + " bytes, the manifest says " +
                  std::to_string(claim) + " (truncated or replaced)");
  }
}

// The saved tensor a live entry loads from: its own name when the dtypes
// agree; else the fp32 masters <-> the parameters (a 16-bit run's masters into
// an fp32 run's parameters, an fp32 run's parameters into a 16-bit run's
// masters); else its own name, cast.
const nlohmann::json* source_of(const nlohmann::json& tensors, const StateEntry& e, std::string& used) {
  static const std::string model = "model/", master = "optim/master/";
  const std::string& name = e.name;
  const std::string dtype = safetensors_dtype(e.local.scalar_type());
  auto pick = [&](const std::string& n) {
    used = n;
    return &tensors[n];
  };
  if (tensors.contains(name) && tensors[name]["dtype"] == dtype) return pick(name);
  if (name.rfind(model, 0) == 0) {
    const std::string m = master + name.substr(model.size());
    if (tensors.contains(m) && tensors[m]["dtype"] == dtype) return pick(m);
  }
  if (name.rfind(master, 0) == 0) {
    const std::string p = model + name.substr(master.size());
    if (tensors.contains(p) && (tensors[p]["dtype"] == dtype || !tensors.contains(name))) return pick(p);
  }
  if (tensors.contains(name)) return pick(name);
  return nullptr;
}

void load_entry(FileCache& files, const std::string& used, const nlohmann::json& saved, const StateEntry& live,
                bool same_model) {
  const std::string where = "checkpoint " + files.folder + ": tensor '" + used + "'";
  const auto saved_shape = saved["shape"].get<std::vector<int64_t>>();
  const at::ScalarType saved_dtype = scalar_type_of(saved["dtype"].get<std::string>());
  if (live.global_shape.empty() && live.local.dim() == 0) {  // a counter
    if (!saved_shape.empty()) throw Error(where + " is " + dims(saved_shape) + ", this run holds a scalar");
    const auto& s = saved["slices"].at(0);
    const SafetensorsFile& f = files.get(s["file"].get<std::string>());
    at::Tensor v = at::empty({}, at::TensorOptions().dtype(saved_dtype));
    f.read(used, 0, static_cast<int64_t>(v.element_size()), v.data_ptr());
    if (s.contains("crc32c") && crc32c(0, v.data_ptr(), v.element_size()) != s["crc32c"].get<uint32_t>())
      throw Error(where + " in " + (fs::path(files.folder) / s["file"].get<std::string>()).string() +
                  " fails its CRC-32C (corrupted)");
    check_counter("checkpoint " + files.folder, used, v.item<double>());
    live.local.copy_(v);
    return;
  }
  if (saved_shape.size() != live.global_shape.size() || (!same_model && saved_shape != live.global_shape))
    throw Error(where + " is " + dims(saved_shape) + ", this run's is " + dims(live.global_shape) +
                " (another model shape)");
  const std::vector<int64_t>& block = live.block_shape;
  const size_t D = block.size();
  const auto opts = at::TensorOptions().dtype(saved_dtype);
  // The live block in the saved dtype: the live values (kept where the
  // checkpoint has none: padding), overwritten by the saved slices.
  at::Tensor values = at::zeros(block, opts);
  at::Tensor covered = at::zeros(block, at::kBool);
  const int64_t flat_begin = live.flat_begin < 0 ? 0 : live.flat_begin;
  const int64_t flat_end = flat_begin + live.local.numel();
  values.view(-1).slice(0, flat_begin, flat_end).copy_(live.local.detach().reshape(-1));
  // Elements of the block that the saved tensor has (inside its global shape).
  std::vector<int64_t> have_len(D);
  for (size_t d = 0; d < D; ++d)
    have_len[d] = std::max<int64_t>(0, std::min(block[d], saved_shape[d] - live.offsets[d]));
  at::Tensor needed = at::zeros(block, at::kBool);
  box(needed, std::vector<int64_t>(D, 0), have_len).fill_(true);
  at::Tensor in_range = at::zeros({elements(block)}, at::kBool);
  in_range.slice(0, flat_begin, flat_end).fill_(true);
  needed &= in_range.view(block);

  for (const auto& s : saved["slices"]) {
    const auto s_off = s["offsets"].get<std::vector<int64_t>>();
    const auto s_block = s["block_shape"].get<std::vector<int64_t>>();
    const int64_t s_flat = s["flat_begin"].get<int64_t>();
    const int64_t s_numel = s["numel"].get<int64_t>();
    const int64_t s_begin = s_flat < 0 ? 0 : s_flat, s_end = s_begin + s_numel;
    // The intersection of the two blocks, in global coordinates.
    std::vector<int64_t> lo(D), hi(D);
    bool empty = false;
    for (size_t d = 0; d < D; ++d) {
      lo[d] = std::max(live.offsets[d], s_off[d]);
      hi[d] = std::min({live.offsets[d] + block[d], s_off[d] + s_block[d], saved_shape[d]});
      empty = empty || hi[d] <= lo[d];
    }
    if (empty) continue;
    // Its span of the saved block's row-major order, cut to what the slice holds.
    std::vector<int64_t> first(D), last(D), len(D), in_live(D);
    for (size_t d = 0; d < D; ++d) {
      first[d] = lo[d] - s_off[d];
      last[d] = hi[d] - 1 - s_off[d];
      len[d] = hi[d] - lo[d];
      in_live[d] = lo[d] - live.offsets[d];
    }
    const int64_t span_begin = std::max(flat_index(first, s_block), s_begin);
    const int64_t span_end = std::min(flat_index(last, s_block) + 1, s_end);
    if (span_end <= span_begin) continue;
    const std::string file = s["file"].get<std::string>();
    const SafetensorsFile& f = files.get(file);
    const SafetensorsTensor& t = f.at(used);
    if (t.dtype != saved_dtype || elements(t.shape) != s_numel)
      throw Error(where + " in " + file + " is not what the manifest says (" + std::to_string(elements(t.shape)) +
                  " elements of " + c10::toString(t.dtype) + ")");
    at::Tensor flat = at::empty({elements(s_block)}, opts);
    at::Tensor has = at::zeros({elements(s_block)}, at::kBool);
    const int64_t es = static_cast<int64_t>(c10::elementSize(saved_dtype));
    at::Tensor span = flat.slice(0, span_begin, span_end);
    f.read(used, (span_begin - s_begin) * es, (span_end - s_begin) * es, span.data_ptr());
    if (span_begin == s_begin && span_end == s_end && s.contains("crc32c") &&
        crc32c(0, span.data_ptr(), static_cast<size_t>(span.numel() * es)) != s["crc32c"].get<uint32_t>())
      throw Error(where + " in " + (fs::path(files.folder) / file).string() + " fails its CRC-32C (corrupted)");
    has.slice(0, span_begin, span_end).fill_(true);
    const at::Tensor src = box(flat.view(s_block), first, len), src_has = box(has.view(s_block), first, len);
    at::Tensor dst = box(values, in_live, len), dst_has = box(covered, in_live, len);
    dst.copy_(at::where(src_has, src, dst));
    dst_has |= src_has;
  }
  const int64_t missing = (needed & ~covered).sum().item<int64_t>();
  if (missing > 0)
    throw Error(where + ": " + std::to_string(missing) + " of the elements this rank holds at " + dims(live.offsets) +
                " " + dims(block) + " are in no file of the checkpoint (a missing shard?)");
  live.local.copy_(values.view(-1).slice(0, flat_begin, flat_end).view(live.local.sizes()));
}

// load_entries once check_shards_on_disk has passed.
void load_checked_entries(const std::string& folder, const nlohmann::json& manifest,
                          const std::vector<StateEntry>& live, bool same_model) {
  FileCache files;
  files.folder = folder;
  for (const auto& f : manifest["files"]) files.bytes[f["name"].get<std::string>()] = f["bytes"].get<int64_t>();
  const nlohmann::json& tensors = manifest["tensors"];
  c10::NoGradGuard no_grad;
  std::map<std::string, double> counters;
  for (const StateEntry& e : live) {
    std::string used;
    const nlohmann::json* saved = source_of(tensors, e, used);
    if (!saved) {
      if (e.name.rfind("loss_scaler/", 0) == 0) continue;  // a run without one: the scaler starts afresh
      throw Error("checkpoint " + folder + " has no tensor '" + e.name + "' (saved by another optimizer or model?)");
    }
    load_entry(files, used, *saved, e, same_model);
    if (e.global_shape.empty() && e.local.dim() == 0) counters[used] = e.local.item<double>();
  }
  check_counters("checkpoint " + folder, counters, manifest);
}

}  // namespace

void load_entries(const std::string& folder, const nlohmann::json& manifest, const std::vector<StateEntry>& live,
                  bool same_model) {
  check_shards_on_disk(folder, manifest);
  load_checked_entries(folder, manifest, live, same_model);
}

StateEntry whole_tensor_entry(const std::string& name, const at::Tensor& t) {
  StateEntry e;
  e.name = name;
  e.local = t;
  e.owner = true;
  if (t.dim() > 0) {
    e.global_shape = t.sizes().vec();
    e.block_shape = e.global_shape;
    e.offsets.assign(e.global_shape.size(), 0);
  }
  return e;
}

at::Tensor read_global_tensor(const std::string& folder, const nlohmann::json& manifest, const std::string& name,
                              at::ScalarType dtype) {
  const auto& tensors = manifest["tensors"];
  if (!tensors.contains(name)) throw Error("checkpoint " + folder + " has no tensor '" + name + "'");
  const auto shape = tensors[name]["shape"].get<std::vector<int64_t>>();
  check_shards_on_disk(folder, manifest);  // before the allocation the shape asks for
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  load_checked_entries(folder, manifest, {whole_tensor_entry(name, out)}, false);
  return out;
}

}  // namespace smp
