#include "runtime/memory_snapshot.h"

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"

#include <smp/error.h>
#include <smp/process_env.h>

#include <ATen/ATen.h>
#include <boost/filesystem.hpp>
#include <spdlog/spdlog.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace smp {

namespace fs = boost::filesystem;

namespace {

// The snapshots live in memory: bounded as a checkpoint's parts are, by what
// the ranks wrote; a part larger than this is not a part of this run.
constexpr int64_t kMaxPartBytes = int64_t{1} << 40;

// A machine's name as a folder name.
std::string machine_name() {
  std::string name;
  if (const char* v = std::getenv("SMP_NODE_NAME"); v && *v) name = v;
  if (name.empty()) {
    char host[256] = "node";
    ::gethostname(host, sizeof host - 1);
    name = host;
  }
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return name.substr(0, 128);
}

std::string step_folder(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p.string(), std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const fs::path& p, const char* data, size_t n) {
  const fs::path tmp = p.string() + ".part-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp.string(), std::ios::binary | std::ios::trunc);
    out.write(data, static_cast<std::streamsize>(n));
    if (!out) throw Error("run.snapshot_dir: cannot write " + tmp.string() + " (is the memory full?)");
  }
  fs::rename(tmp, p);
}

// The snapshots this machine holds: step -> the files of its folder (only
// those with a manifest: a whole one, or one a machine was sent).
std::map<int64_t, nlohmann::json> held(const std::string& node_dir) {
  std::map<int64_t, nlohmann::json> out;
  boost::system::error_code ec;
  if (!fs::is_directory(node_dir, ec)) return out;
  for (const auto& d : fs::directory_iterator(node_dir, ec)) {
    const std::string name = d.path().filename().string();
    if (name.size() < 13 || name.size() > 24 || name.rfind("step-", 0) != 0 ||
        name.find_first_not_of("0123456789", 5) != std::string::npos || !fs::exists(d.path() / "manifest.json"))
      continue;
    const int64_t step = std::atoll(name.c_str() + 5);
    nlohmann::json files = nlohmann::json::array();
    for (const auto& f : fs::directory_iterator(d.path(), ec))
      if (f.path().extension() == ".safetensors" || f.path().filename() == "manifest.json")
        files.push_back(f.path().filename().string());
    nlohmann::json needed = nlohmann::json::array({"manifest.json"});
    try {
      const nlohmann::json manifest = read_manifest(d.path().string());  // kept: the loop reads into it
      for (const auto& f : manifest["files"]) needed.push_back(f["name"]);
    } catch (const std::exception&) {
      continue;  // a manifest that does not read is not a snapshot
    }
    out[step] = {{"files", files}, {"needed", needed}};
  }
  return out;
}

}  // namespace

MemorySnapshot::MemorySnapshot(const JobConfig& job, Communicator& world, const std::string& checkpoint_dir)
    : world_(world), node_(machine_name()) {
  // Where this rank sits on its machine, as the launcher (smp-launch, srun,
  // mpirun) says it; the next machine's counterpart is local_size_ ranks on.
  try {
    const ProcessEnv env = ProcessEnv::from_environment();
    local_size_ = std::max(1, env.local_world_size);
    local_rank_ = std::clamp(env.local_rank, 0, local_size_ - 1);
  } catch (const std::exception&) {
    local_size_ = 1, local_rank_ = 0;  // a malformed environment was refused where the job read it
  }
  // The run by its checkpoint folder (the same string on every machine).
  const std::string run = fs::absolute(checkpoint_dir).lexically_normal().string();
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016zx", std::hash<std::string>{}(run));
  node_dir_ = (fs::path(job.run.snapshot_dir) / ("smp-snapshot-" + std::string(hash)) / node_).string();
  // Snapshots serve the re-formations of one launch: a fresh start of the
  // run (no restart, no re-formation) discards what an earlier launch left in
  // this machine's memory, as it would have been lost with a reboot; the
  // checkpoints on disk are what carries a run across launches.
  const char* restarts = std::getenv("SMP_RESTART_COUNT");
  if (local_rank_ == 0 && (!restarts || !*restarts || std::string(restarts) == "0")) {
    boost::system::error_code ec;
    fs::remove_all(node_dir_, ec);
  }
}

std::vector<std::string> MemorySnapshot::allgather_text(const std::string& mine) {
  const int n = world_.size();
  at::Tensor len = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong), lens = at::zeros({n}, at::kLong);
  world_.allgather(len, lens)->wait();
  const int64_t longest = lens.max().item<int64_t>();
  at::Tensor bytes = at::zeros({longest}, at::kByte), all = at::zeros({n * longest}, at::kByte);
  std::copy(mine.begin(), mine.end(), reinterpret_cast<char*>(bytes.data_ptr<uint8_t>()));
  world_.allgather(bytes, all)->wait();
  std::vector<std::string> out;
  const char* p = reinterpret_cast<const char*>(all.data_ptr<uint8_t>());
  for (int r = 0; r < n; ++r) out.emplace_back(p + r * longest, static_cast<size_t>(lens[r].item<int64_t>()));
  return out;
}

void MemorySnapshot::save(int64_t step, const std::vector<StateEntry>& entries, const nlohmann::json& info) {
  const int rank = world_.rank(), n = world_.size();
  const fs::path folder = fs::path(node_dir_) / (step_folder(step) + ".partial");
  fs::create_directories(folder);
  const nlohmann::json index = write_checkpoint_part(folder.string(), rank, entries);
  std::vector<nlohmann::json> parts;
  for (const std::string& text : allgather_text(index.dump())) parts.push_back(nlohmann::json::parse(text));
  // A copy to the same local rank of the next machine; one from the previous.
  if (n > local_size_) {
    const int to = (rank + local_size_) % n, from = (rank - local_size_ + n) % n;
    const std::string mine = index.contains("file") ? read_bytes(folder / index["file"]["name"].get<std::string>()) : "";
    at::Tensor out_len = at::full({1}, static_cast<int64_t>(mine.size()), at::kLong), in_len = at::zeros({1}, at::kLong);
    auto s = world_.send(out_len, to, 7101);
    auto r = world_.recv(in_len, from, 7101);
    s->wait();
    r->wait();
    const int64_t got = in_len.item<int64_t>();
    if (got < 0 || got > kMaxPartBytes) throw Error("run.snapshot_every: rank " + std::to_string(from) + " sent a part of " + std::to_string(got) + " bytes");
    at::Tensor out_bytes = at::empty({static_cast<int64_t>(mine.size())}, at::kByte), in_bytes = at::empty({got}, at::kByte);
    std::copy(mine.begin(), mine.end(), reinterpret_cast<char*>(out_bytes.data_ptr<uint8_t>()));
    std::shared_ptr<Work> sb, rb;
    if (!mine.empty()) sb = world_.send(out_bytes, to, 7102);
    if (got > 0) rb = world_.recv(in_bytes, from, 7102);
    if (sb) sb->wait();
    if (rb) rb->wait();
    if (got > 0 && parts[from].contains("file"))
      write_bytes(folder / parts[from]["file"]["name"].get<std::string>(),
                  reinterpret_cast<const char*>(in_bytes.data_ptr<uint8_t>()), static_cast<size_t>(got));
  }
  world_.barrier();  // every part of this machine is written
  if (local_rank_ == 0) {
    write_checkpoint_manifest(folder.string(), parts, info);
    const fs::path done = fs::path(node_dir_) / step_folder(step);
    fs::remove_all(done);
    fs::rename(folder, done);
    // The newest keep_ stay: memory is what a machine has least of.
    std::vector<std::pair<int64_t, fs::path>> old;  // by step (names past 10^8 steps are longer)
    for (const auto& d : fs::directory_iterator(node_dir_)) {
      const std::string name = d.path().filename().string();
      if (name.rfind("step-", 0) == 0 && name.find('.') == std::string::npos)
        old.emplace_back(std::atoll(name.c_str() + 5), d.path());
    }
    std::sort(old.begin(), old.end());
    for (size_t i = 0; i + keep_ < old.size(); ++i) fs::remove_all(old[i].second);
  }
  // Whole on every machine before smp-launch hears of it: it may re-form the
  // job at this snapshot at once.
  world_.barrier();
  if (rank == 0) notify_launcher("committed " + std::to_string(step));
}

std::string MemorySnapshot::gather_newest(int64_t newer_than) {
  const int rank = world_.rank();
  nlohmann::json report = {{"node", node_}, {"steps", nlohmann::json::object()}};
  for (const auto& [step, what] : held(node_dir_)) report["steps"][std::to_string(step)] = what;
  std::vector<nlohmann::json> all;
  for (const std::string& text : allgather_text(report.dump())) all.push_back(nlohmann::json::parse(text));
  // Every rank decides alike, from the same reports: the newest step whose
  // files the machines hold between them.
  std::map<std::string, int> writer;  // machine -> its lowest rank (writes what it is sent)
  for (int r = static_cast<int>(all.size()) - 1; r >= 0; --r) writer[all[r]["node"].get<std::string>()] = r;
  std::set<int64_t> steps;
  for (const auto& rep : all)
    for (const auto& [s, what] : rep["steps"].items()) steps.insert(std::atoll(s.c_str()));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    const int64_t step = *it;
    if (step <= newer_than) return "";
    const std::string key = std::to_string(step);
    std::set<std::string> needed, present;
    std::map<std::string, int> source;  // file -> the lowest rank whose machine has it
    for (int r = 0; r < static_cast<int>(all.size()); ++r) {
      if (!all[r]["steps"].contains(key)) continue;
      for (const auto& f : all[r]["steps"][key]["needed"]) needed.insert(f.get<std::string>());
      for (const auto& f : all[r]["steps"][key]["files"]) {
        present.insert(f.get<std::string>());
        source.emplace(f.get<std::string>(), r);
      }
    }
    if (!std::includes(present.begin(), present.end(), needed.begin(), needed.end())) continue;
    // Whole between them: each machine is sent what it lacks.
    const fs::path folder = fs::path(node_dir_) / step_folder(step);
    const bool i_write = writer[node_] == rank;
    std::set<std::string> mine;
    if (all[rank]["steps"].contains(key))
      for (const auto& f : all[rank]["steps"][key]["files"]) mine.insert(f.get<std::string>());
    if (i_write) fs::create_directories(folder);
    int64_t sent = 0;
    for (const std::string& f : needed) {
      bool someone_lacks = false;
      for (const auto& rep : all)
        if (!rep["steps"].contains(key) ||
            std::find(rep["steps"][key]["files"].begin(), rep["steps"][key]["files"].end(), f) ==
                rep["steps"][key]["files"].end())
          someone_lacks = true;
      if (!someone_lacks) continue;
      const int root = source.at(f);
      std::string bytes = rank == root ? read_bytes(folder / f) : "";
      at::Tensor len = at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
      world_.broadcast(len, root)->wait();
      const int64_t size = len.item<int64_t>();
      if (size < 0 || size > kMaxPartBytes) throw Error("run.snapshot_every: a snapshot file of " + std::to_string(size) + " bytes");
      at::Tensor data = at::empty({size}, at::kByte);
      if (rank == root) std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(data.data_ptr<uint8_t>()));
      world_.broadcast(data, root)->wait();
      sent += size;
      if (i_write && !mine.count(f))
        write_bytes(folder / f, reinterpret_cast<const char*>(data.data_ptr<uint8_t>()), static_cast<size_t>(size));
    }
    world_.barrier();  // every machine's folder is whole
    if (rank == 0)
      spdlog::info("memory snapshot of step {}: whole on every machine ({} bytes sent to machines that lacked parts)",
                   step, sent);
    return folder.string();
  }
  return "";
}

void MemorySnapshot::remove_local() {
  if (local_rank_ != 0) return;
  boost::system::error_code ec;
  fs::remove_all(node_dir_, ec);
  fs::remove(fs::path(node_dir_).parent_path(), ec);  // when it was the last machine's
}

}  // namespace smp
