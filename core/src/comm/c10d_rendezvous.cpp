// The job's Rendezvous over a c10d TCPStore: the store of the job's endpoint,
// the communicators made over it (their transports connected here), and the
// barriers over the store (arrive / wait_for_all, the shutdown barrier).
#include "comm/communicator.h"

#include <smp/error.h>

#include "comm/c10d_communicator.h"
#include "comm/c10d_compat.h"
#include "comm/shm_collectives.h"
#include "comm/shm_mailbox.h"
#include "comm/store_wait.h"
#include "comm/wait.h"

#include <spdlog/spdlog.h>

#include <map>
#include <mutex>
#include <set>

namespace smp {
namespace {

class C10dRendezvous final : public Rendezvous {
 public:
  // `ns`: the prefix of every key this rendezvous writes ("smp/<generation>/"),
  // apart from those of the other rendezvous over the same store (see connect()).
  C10dRendezvous(std::shared_ptr<c10d_compat::Store> store, std::string ns, std::string addr, int port, int rank,
                 int world, std::chrono::milliseconds timeout)
      : store_(std::move(store)), ns_(std::move(ns)), addr_(std::move(addr)), port_(port), rank_(rank), world_(world),
        timeout_(timeout) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  std::unique_ptr<Communicator> new_communicator(const std::string& axis, const std::string& name,
                                                 const std::vector<int>& global_ranks,
                                                 const CommOptions& options) override {
    auto ctx = std::make_shared<GroupContext>();
    ctx->axis = axis;
    ctx->name = name;
    ctx->ranks = global_ranks;
    ctx->timeout_ms = options.timeout.count();
    const std::string what =
        "communicator '" + name + "' (axis '" + axis + "', world ranks " + join_ranks(global_ranks) + ")";
    ctx->rank = member_index(name, what, global_ranks);
    Transports transports;
    if (global_ranks.size() > 1) transports = connect(name, what, ctx->rank, global_ranks, options);
    return make_c10d_communicator(std::move(ctx), std::move(transports));
  }

  void set(const std::string& key, const std::string& value) override {
    try {
      store_->set(ns_ + "kv/" + key, value);
    } catch (const c10d_compat::Failure& f) {
      throw Error("rendezvous: set('" + key + "') on " + addr_ + ":" + std::to_string(port_) + " failed: " + f.what());
    }
  }

  std::string get(const std::string& key) override {
    try {
      return store_->get(ns_ + "kv/" + key);
    } catch (const c10d_compat::Failure& f) {
      throw Error("rendezvous: get('" + key + "') on " + addr_ + ":" + std::to_string(port_) + " failed" +
                  (f.timed_out() ? " (timed out after " + std::to_string(timeout_.count()) + " ms)" : "") + ": " +
                  f.what());
    }
  }

  void arrive(const std::string& key) override {
    try {
      smp::arrive(*store_, ns_ + "arrive/" + key, rank_);
    } catch (const c10d_compat::Failure& f) {
      throw Error("rendezvous: arrive('" + key + "') on " + addr_ + ":" + std::to_string(port_) + " failed: " +
                  f.what());
    }
  }

  void wait_for_all(const std::string& key, std::chrono::milliseconds timeout, const std::string& what) override {
    try {
      wait_for_arrivals(*store_, ns_ + "arrive/" + key, world_, timeout, what, "world rank");
    } catch (const c10d_compat::Failure& f) {
      throw Error("rendezvous: waiting for " + what + " on " + addr_ + ":" + std::to_string(port_) + " failed: " +
                  f.what());
    }
  }

  // Runs in Runtime's destructor: nothing may throw from here.
  void shutdown(std::chrono::milliseconds timeout) override {
    try {
      arrive("shutdown");
      if (rank_ == 0) wait_for_all("shutdown", timeout, "every rank to finish");
    } catch (const std::exception& e) {
      spdlog::warn("rendezvous shutdown on {}:{}: {}; closing the store anyway", addr_, port_, e.what());
    }
  }

 private:
  // This rank's index in the group; throws for a group it cannot be in.
  int member_index(const std::string& name, const std::string& what, const std::vector<int>& global_ranks) {
    if (name.empty()) throw Error("rendezvous: " + what + ": empty name");
    std::set<int> seen;
    int me = -1;
    for (size_t i = 0; i < global_ranks.size(); ++i) {
      int g = global_ranks[i];
      if (g < 0 || g >= world_)
        throw Error("rendezvous: " + what + ": rank " + std::to_string(g) + " is outside the world of " +
                    std::to_string(world_));
      if (!seen.insert(g).second) throw Error("rendezvous: " + what + ": rank " + std::to_string(g) + " appears twice");
      if (g == rank_) me = static_cast<int>(i);
    }
    if (me < 0)
      throw Error("rendezvous: " + what + ": this process (world rank " + std::to_string(rank_) +
                  ") is not a member of the group");
    std::lock_guard<std::mutex> lock(mu_);
    if (!names_.insert(name).second)
      throw Error("rendezvous: " + what + ": the name is already used by another communicator of this process");
    return me;
  }

  // Connects the group's transports (every member at once): Gloo, NCCL for
  // CUDA tensors where it applies, shared memory where every member is on this host.
  Transports connect(const std::string& name, const std::string& what, int me, const std::vector<int>& global_ranks,
                     const CommOptions& options) {
    Transports t;
    const int n = static_cast<int>(global_ranks.size());
    const auto t0 = std::chrono::steady_clock::now();
    const std::string prefix = ns_ + "comm/" + name + "/";
    try {
      // Every member must agree on the membership; group rank 0 publishes it.
      const std::string members = join_ranks(global_ranks);
      const std::string key = ns_ + "meta/" + name;
      if (me == 0) {
        store_->set(key, members);
      } else {
        std::string theirs = store_->get(key);
        if (theirs != members)
          throw Error("rendezvous: " + what + ": this rank was given world ranks " + members + " but world rank " +
                      std::to_string(global_ranks[0]) + " created '" + name + "' with " + theirs);
      }
      c10d_compat::BackendOptions bo;
      bo.timeout = options.timeout;
      bo.master_addr = addr_;
      t.gloo = c10d_compat::make_backend(*store_, prefix, me, n, bo);
      if (options.cuda && use_nccl(name, what, me, global_ranks, options)) {
        bo.cuda = true;
        bo.cuda_device = options.cuda_device;
        t.nccl = c10d_compat::make_backend(*store_, prefix + "nccl/", me, n, bo);
      }
      if (options.shm_slot_bytes > 0)
        t.shm = ShmCollectives::create(store_, prefix + "shm/", me, n, options.shm_slot_bytes, options.timeout);
      // Every member on this host (what ShmCollectives::create found): sends
      // and receives of CPU tensors through shared memory too. Outboxes are
      // made on first use, so groups that never send cost nothing.
      if (t.shm)
        t.mailbox = ShmMailbox::create(store_, prefix + "p2p/", me, n, options.shm_slot_bytes, options.timeout);
    } catch (const c10d_compat::Failure& f) {
      throw Error("rendezvous: creating " + what + " failed on world rank " + std::to_string(rank_) +
                  (f.timed_out() ? " (timed out: did every member create it?)" : "") + ": " + f.what());
    }
    spdlog::debug("communicator {} ({}{}{}, {} ranks {}) ready in {} ms", name, t.gloo->name(),
                  t.nccl ? ", NCCL for CUDA tensors" : (options.cuda ? ", CUDA tensors through host memory" : ""),
                  t.shm ? ", CPU all-reduce/all-gather/reduce-scatter/send/recv through shared memory" : "", n,
                  join_ranks(global_ranks),
                  std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
    return t;
  }

  // NCCL refuses two ranks of a communicator on one GPU; every member publishes
  // its GPU and all decide alike: "auto" falls back to host memory, "nccl" fails.
  bool use_nccl(const std::string& name, const std::string& what, int me, const std::vector<int>& global_ranks,
                const CommOptions& options) {
    if (options.cuda_backend == "gloo") return false;
    if (!c10d_compat::has_nccl())
      throw Error("rendezvous: " + what + ": CUDA tensors need NCCL, but this LibTorch (" +
                  c10d_compat::torch_version() + ") was built without it (comm.cuda_backend = \"gloo\" avoids it)");
    const std::string prefix = ns_ + "dev/" + name + "/";
    store_->set(prefix + std::to_string(me), options.device_key);
    std::map<std::string, int> first;
    for (size_t i = 0; i < global_ranks.size(); ++i) {
      const std::string key = static_cast<int>(i) == me ? options.device_key : store_->get(prefix + std::to_string(i));
      auto [it, fresh] = first.emplace(key, global_ranks[i]);
      if (fresh) continue;
      const std::string why = "world ranks " + std::to_string(it->second) + " and " + std::to_string(global_ranks[i]) +
                              " share " + key + " and NCCL needs one GPU per rank";
      if (options.cuda_backend == "nccl") throw Error("comm.cuda_backend = \"nccl\": " + what + ": " + why);
      if (me == 0) spdlog::info("{}: {}: CUDA tensors go through host memory and Gloo", what, why);
      return false;
    }
    return true;
  }

  std::shared_ptr<c10d_compat::Store> store_;
  std::string ns_;
  std::string addr_;
  int port_, rank_, world_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::set<std::string> names_;
};

// The store of a job's endpoint (master address and port) as this rank sees
// it: world rank 0 hosts the server, the others are clients. A process may join
// the same job again and again (one Runtime after another): every rendezvous of
// a process over one endpoint shares one store, made by the first and kept
// for the process's life, and writes its keys under its own generation.
//
// Made anew for each, a later rendezvous failed now and then (issue 54): world
// rank 0 closes its server only when its runtime is destroyed, after its
// shutdown() has waited for every rank, so a rank that left first and joined
// again connected to the previous runtime's server (still listening on the
// port), read that runtime's keys (a group's members, Gloo's addresses of
// groups that no longer listen: "connect [127.0.0.1]:35721: Connection
// refused") or lost its connection when the server closed ("Connection reset by
// peer"), while rank 0's new server waited for it. One server, and keys the
// previous runtimes never wrote, rule both out. The ranks agree on the
// generation by counting: every rank joins the same runtimes in the same order.
struct EndpointStore {
  std::mutex mu;  // held while the store is made (the server waits there for every rank)
  std::shared_ptr<c10d_compat::Store> store;
  int joins = 0;  // rendezvous made over it
};

std::shared_ptr<EndpointStore> endpoint_store(const std::string& key) {
  // Destroyed at exit (rank 0's server closes then), after the process's last
  // runtime waited in shutdown() for every rank.
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<EndpointStore>> stores;
  std::lock_guard<std::mutex> lock(mu);
  auto& s = stores[key];
  if (!s) s = std::make_shared<EndpointStore>();
  return s;
}

}  // namespace

std::shared_ptr<Rendezvous> Rendezvous::connect(const std::string& master_addr, int master_port, int rank,
                                                int world_size, std::chrono::milliseconds timeout) {
  const std::string where = master_addr + ":" + std::to_string(master_port);
  if (world_size < 1 || rank < 0 || rank >= world_size)
    throw Error("rendezvous: invalid rank " + std::to_string(rank) + " of world size " + std::to_string(world_size));
  if (master_port < 1 || master_port > 65535)
    throw Error("rendezvous: invalid master port " + std::to_string(master_port));
  const auto t0 = std::chrono::steady_clock::now();
  // A world of one has no other rank to mix runtimes up: its store lives and
  // dies with its rendezvous (and a second one on the same port is refused).
  std::shared_ptr<EndpointStore> shared;
  std::unique_lock<std::mutex> lock;
  if (world_size > 1) {
    shared = endpoint_store(where + "/" + std::to_string(rank) + "/" + std::to_string(world_size));
    lock = std::unique_lock<std::mutex>(shared->mu);
  }
  std::shared_ptr<c10d_compat::Store> store = shared ? shared->store : nullptr;
  try {
    if (store)
      store->set_timeout(timeout);  // this runtime's run.timeout_s
    else
      store = c10d_compat::connect_tcp_store(master_addr, master_port, rank == 0, world_size, timeout);
  } catch (const c10d_compat::Failure& f) {
    std::string msg = f.what();
    std::string hint;
    if (rank == 0 && (msg.find("in use") != std::string::npos || msg.find("listen") != std::string::npos ||
                      msg.find("bind") != std::string::npos))
      hint = " (is another job using port " + std::to_string(master_port) + "? pick another with --master-port)";
    else if (f.timed_out())
      hint = rank == 0 ? " (not every rank joined within " + std::to_string(timeout.count()) + " ms)"
                       : " (could not reach world rank 0 within " + std::to_string(timeout.count()) + " ms)";
    throw Error("rendezvous at " + where + " failed on world rank " + std::to_string(rank) + " of " +
                std::to_string(world_size) + (rank == 0 ? " (hosting the store)" : "") + hint + ": " + msg);
  }
  int generation = 0;
  if (shared) {
    shared->store = store;
    generation = shared->joins++;
  }
  spdlog::debug("rendezvous at {} ({} ranks, generation {}) done in {} ms", where, world_size, generation,
                std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
  return std::make_shared<C10dRendezvous>(std::move(store), "smp/" + std::to_string(generation) + "/", master_addr,
                                          master_port, rank, world_size, timeout);
}


}  // namespace smp
