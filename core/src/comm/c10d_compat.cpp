// The c10d boundary: TCPStore, PrefixStore, ProcessGroupGloo (ProcessGroupNCCL
// when LibTorch has it), Work. Written against LibTorch 1.13 (ProcessGroupGloo
// derives from c10d::ProcessGroup) and 2.x (it derives from c10d::Backend); we
// only use the concrete classes, whose methods have the same spelling in both.
#include "comm/c10d_compat.h"

#include "comm/socket_bytes.h"

#include <torch/version.h>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <thread>

#ifndef USE_C10D_GLOO
#error "smp needs LibTorch built with Gloo (USE_C10D_GLOO)"
#endif

namespace smp::c10d_compat {

namespace {

bool looks_like_timeout(const std::string& m) {
  return m.find("imed out") != std::string::npos || m.find("imeout") != std::string::npos ||
         m.find("timed-out") != std::string::npos;
}

// Runs f, turning c10 / Gloo / std exceptions into Failure.
template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Failure&) {
    throw;
  } catch (const c10::Error& e) {
    std::string m = e.what_without_backtrace();
    throw Failure(m, looks_like_timeout(m));
  } catch (const std::exception& e) {
    std::string m = e.what();
    throw Failure(m, looks_like_timeout(m));
  }
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return c10d::ReduceOp::SUM;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
    case ReduceOp::Product: return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

class C10dWork final : public PendingWork {
 public:
  // wait_timeout: passed to Work::wait. Collectives get a generous backstop
  // (Gloo's own per-operation timeout fires first with a better message);
  // Gloo send/recv get the real timeout (their wait applies it to the transfer).
  C10dWork(c10::intrusive_ptr<c10d::Work> work, std::chrono::milliseconds wait_timeout)
      : work_(std::move(work)), timeout_(wait_timeout) {}
  void wait() override {
    guarded([&] {
      bool done = work_->wait(timeout_);
      if (!done && timeout_ != ::kNoTimeout) throw Failure("operation did not complete within " + std::to_string(timeout_.count()) + " ms", true);
    });
  }
  bool ready() override {
    return guarded([&] { return work_->isCompleted(); });
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::chrono::milliseconds timeout_;
};

class TcpStore final : public Store {
 public:
  TcpStore(c10::intrusive_ptr<c10d::TCPStore> store, std::string host)
      : port_(store->getPort()), store_(std::move(store)), host_(std::move(host)) {}
  int port() const { return port_; }  // the store's connections are not any group's
  void set(const std::string& key, const std::string& value) override {
    guarded([&] { store_->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
  }
  std::string get(const std::string& key) override {
    return guarded([&] {
      auto v = store_->get(key);
      return std::string(v.begin(), v.end());
    });
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return guarded([&] { return store_->add(key, delta); });
  }
  bool check(const std::string& key) override {
    return guarded([&] { return store_->check({key}); });
  }
  void set_timeout(std::chrono::milliseconds timeout) override {
    guarded([&] { store_->setTimeout(timeout); });
  }
  const c10::intrusive_ptr<c10d::Store>& raw() const { return store_; }

  // One Gloo device per process and rendezvous, shared by every communicator.
  std::shared_ptr<::gloo::transport::Device> gloo_device(const std::string& master_addr) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!device_) device_ = make_gloo_device(master_addr.empty() ? host_ : master_addr);
    return device_;
  }

 private:
  // GLOO_SOCKET_IFNAME (as in PyTorch) wins; a loopback master means a
  // single-machine job on 127.0.0.1; otherwise bind to the local address that
  // routes to the master; as a last resort Gloo's default (hostname).
  static std::shared_ptr<::gloo::transport::Device> make_gloo_device(const std::string& master) {
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_DGRAM;
    std::string local;
    if (::getaddrinfo(master.c_str(), "9", &hints, &res) == 0 && res) {
      auto* sin = reinterpret_cast<sockaddr_in*>(res->ai_addr);
      if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127) {
        local = "127.0.0.1";
      } else {
        int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
        if (fd >= 0) {
          if (::connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            sockaddr_in me{};
            socklen_t len = sizeof(me);
            char buf[INET_ADDRSTRLEN] = {0};
            if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
                ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf)))
              local = buf;
          }
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    if (!local.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(local);
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }

  int port_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::string host_;
  std::mutex mu_;
  std::shared_ptr<::gloo::transport::Device> device_;
};

// The operations, identical for every c10d process group class.
template <class PG>
class PGBackend final : public Backend {
 public:
  // NCCL's wait() with a timeout blocks the host until the kernel finished;
  // without one it only orders the current CUDA stream after NCCL's (the
  // overlap we want), and ProcessGroupNCCL's watchdog enforces the timeout.
  // sockets: the connections the group opened (Gloo), whose bytes are counted;
  // counted = false: no count (NCCL).
  PGBackend(c10::intrusive_ptr<PG> pg, const char* name, bool is_nccl, std::chrono::milliseconds timeout,
            std::vector<SocketRef> sockets = {}, bool counted = false)
      : pg_(std::move(pg)), name_(name), nccl_(is_nccl), timeout_(is_nccl ? ::kNoTimeout : timeout),
        backstop_(is_nccl ? ::kNoTimeout : timeout * 2 + std::chrono::seconds(10)), sockets_(std::move(sockets)),
        counted_(counted), baseline_(counted ? smp::bytes_written(sockets_) : 0) {}

  const char* name() const override { return name_; }
  bool has_reduce_scatter() const override { return nccl_; }

  std::shared_ptr<PendingWork> allreduce(at::Tensor& t, ReduceOp op) override {
    return guarded([&] {
      std::vector<at::Tensor> v{t};
      c10d::AllreduceOptions o;
      o.reduceOp = to_c10d(op);
      return wrap(pg_->allreduce(v, o), backstop_);
    });
  }

  std::shared_ptr<PendingWork> allgather(at::Tensor& in, at::Tensor& out) override {
    return guarded([&] {
      if (nccl_) return wrap(pg_->_allgather_base(out, in), backstop_);
      // Gloo has no _allgather_base in 1.13: gather into dim-0 views of out.
      const int64_t n = out.size(0) / std::max<int64_t>(in.size(0), 1);
      std::vector<std::vector<at::Tensor>> outs(1);
      for (int64_t i = 0; i < n; ++i) outs[0].push_back(out.narrow(0, i * in.size(0), in.size(0)));
      std::vector<at::Tensor> ins{in};
      return wrap(pg_->allgather(outs, ins), backstop_);
    });
  }

  std::shared_ptr<PendingWork> reduce_scatter(at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    return guarded([&] {
      TORCH_CHECK(nccl_, "this backend has no native reduce_scatter");
      c10d::ReduceScatterOptions o;
      o.reduceOp = to_c10d(op);
      return wrap(pg_->_reduce_scatter_base(out, in, o), backstop_);
    });
  }

  std::shared_ptr<PendingWork> alltoall(at::Tensor& in, at::Tensor& out, std::vector<int64_t> in_splits,
                                        std::vector<int64_t> out_splits) override {
    return guarded([&] {
      // alltoall_base(output, input, outputSplitSizes, inputSplitSizes, opts)
      return wrap(pg_->alltoall_base(out, in, out_splits, in_splits), backstop_);
    });
  }

  std::shared_ptr<PendingWork> broadcast(at::Tensor& t, int root) override {
    return guarded([&] {
      std::vector<at::Tensor> v{t};
      c10d::BroadcastOptions o;
      o.rootRank = root;
      o.rootTensor = 0;
      return wrap(pg_->broadcast(v, o), backstop_);
    });
  }

  std::shared_ptr<PendingWork> send(at::Tensor& t, int peer, int tag) override {
    return guarded([&] {
      std::vector<at::Tensor> v{t};
      return wrap(pg_->send(v, peer, tag), nccl_ ? backstop_ : timeout_);
    });
  }

  std::shared_ptr<PendingWork> recv(at::Tensor& t, int peer, int tag) override {
    return guarded([&] {
      std::vector<at::Tensor> v{t};
      return wrap(pg_->recv(v, peer, tag), nccl_ ? backstop_ : timeout_);
    });
  }

  std::shared_ptr<PendingWork> barrier() override {
    return guarded([&] { return wrap(pg_->barrier(c10d::BarrierOptions()), backstop_); });
  }

  int64_t bytes_written() const override { return counted_ ? smp::bytes_written(sockets_) - baseline_ : -1; }

 private:
  static std::shared_ptr<PendingWork> wrap(c10::intrusive_ptr<c10d::Work> w, std::chrono::milliseconds t) {
    return std::make_shared<C10dWork>(std::move(w), t);
  }
  c10::intrusive_ptr<PG> pg_;
  const char* name_;
  bool nccl_;
  std::chrono::milliseconds timeout_, backstop_;
  std::vector<SocketRef> sockets_;
  bool counted_;
  int64_t baseline_;  // what the connections carried while the group was set up
};

}  // namespace

std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                                         std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = is_server;
  opts.numWorkers = static_cast<std::size_t>(world_size);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  if (is_server) {
    // No retry: a busy port is the user's to fix.
    return guarded([&] {
      auto s = c10::make_intrusive<c10d::TCPStore>(host, opts);
      return std::make_shared<TcpStore>(s, host);
    });
  }
  // The server may not be listening yet: TCPStore's client retries refused
  // connections itself; we also retry anything else until the deadline.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(100);
  while (true) {
    try {
      return guarded([&] {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        opts.timeout = std::max(left, std::chrono::milliseconds(100));
        auto s = c10::make_intrusive<c10d::TCPStore>(host, opts);
        s->setTimeout(timeout);
        return std::make_shared<TcpStore>(s, host);
      });
    } catch (const Failure& f) {
      if (std::chrono::steady_clock::now() + pause >= deadline) throw;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(1000));
    }
  }
}

std::unique_ptr<Backend> make_backend(Store& store, const std::string& prefix, int rank, int size,
                                      const BackendOptions& options) {
  auto& tcp = dynamic_cast<TcpStore&>(store);
  return guarded([&]() -> std::unique_ptr<Backend> {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, tcp.raw());
    if (options.cuda) {
#ifdef USE_C10D_NCCL
      auto o = c10d::ProcessGroupNCCL::Options::create();
      o->timeout = options.timeout;
      auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, size, o);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
      // Connected now, on the thread that makes the groups (in one order on
      // every rank), with its device, not at the first collective, which may
      // be on the autograd thread or where one rank waits for another.
      if (options.cuda_device >= 0) {
        const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(options.cuda_device));
        pg->setBoundDeviceId(device);
        pg->eagerConnectSingleDevice(device);
      }
#endif
      return std::make_unique<PGBackend<c10d::ProcessGroupNCCL>>(pg, "nccl", true, options.timeout);
#else
      throw Failure("a CUDA communicator was requested but this LibTorch (" TORCH_VERSION
                    ") was built without NCCL",
                    false);
#endif
    }
    auto o = c10d::ProcessGroupGloo::Options::create(options.timeout);
    o->devices.push_back(tcp.gloo_device(options.master_addr));
    o->threads = 2;
    // Gloo connects to every peer in its constructor, one socket each: the
    // sockets that appear meanwhile are this group's (groups are created one
    // at a time, and a peer learns where to connect only from this rank's
    // address for this group), but for late connections to the store (world
    // rank 0 hosts it). Any other count and the group stays uncounted.
    const auto before = connected_tcp_sockets(tcp.port());
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, o);
    auto sockets = opened_between(before, connected_tcp_sockets(tcp.port()));
    const bool counted = static_cast<int>(sockets.size()) == size - 1;
    return std::make_unique<PGBackend<c10d::ProcessGroupGloo>>(pg, "gloo", false, options.timeout, std::move(sockets),
                                                               counted);
  });
}

bool has_nccl() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

const char* torch_version() { return TORCH_VERSION; }

}  // namespace smp::c10d_compat
