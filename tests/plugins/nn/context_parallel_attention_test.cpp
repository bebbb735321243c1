// Context-parallel attention over real ranks: cp processes forked here, a
// real Rendezvous and Gloo over loopback, each rank holding its load-balanced
// share of the sequence. The ring (smp_nn/ring_attention.hpp) and the
// all-to-all form (smp_nn/ulysses_attention.hpp), both also with grouped-query
// attention, give outputs and query, key and value gradients equal to whole
// attention's rows at the rank's positions, causal and not, at several
// sequence lengths, at cp 2 and 4, with and without a padding mask (an
// encoder's: each sample's tail padding, one of them padded from inside the
// first chunk, so that whole blocks of keys are padding); heads that cp does
// not divide are refused by the all-to-all form, naming the key.
#include <smp_nn/ring_attention.hpp>
#include <smp_nn/ulysses_attention.hpp>

#include <smp/mesh.h>
#include <smp/process_env.h>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "plugin/host_api.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "plugins/nn/whole_attention.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

namespace {

using at::Tensor;

using smp_test::whole_attention;

// One rank: every case, checked against whole attention; returns the failures.
int run_rank(int rank, int cp, int port) {
  at::set_num_threads(1);
  auto rdv = smp::Rendezvous::connect("127.0.0.1", port, rank, cp, std::chrono::seconds(60));
  smp::CommOptions options;
  options.timeout = std::chrono::seconds(60);
  smp::DeviceMesh mesh(cp, rank, 1, 1, cp);  // the ring: one group of every rank
  smp::ProcessGroups groups(mesh, rdv, options);
  smp::sdk::host_slot() = smp::host_api();
  const smp::sdk::Comm comm(groups.get(smp::Axis::TP).handle());
  int failures = 0;
  const auto check = [&](const std::string& what, const Tensor& got, const Tensor& want) {
    const double err = (got - want).abs().max().item<double>();
    if (!(err < 1e-12)) {
      ++failures;
      std::fprintf(stderr, "rank %d of cp %d: %s differs by %g\n", rank, cp, what.c_str(), err);
    }
  };
  enum class Form { Ring, AllToAll };
  for (const Form form : {Form::Ring, Form::AllToAll})
    for (const int64_t kv_heads : {8, 4, 2})
      for (const int64_t seq : {int64_t{4} * cp, int64_t{8} * cp, int64_t{12} * cp})
        for (const bool causal : {true, false})
          for (const bool padded : {false, true}) {
            const std::string name = std::string(form == Form::Ring ? "ring" : "all-to-all") + " kv heads " +
                                     std::to_string(kv_heads) + " seq " + std::to_string(seq) +
                                     (causal ? " causal" : " full") + (padded ? " padded" : "");
            at::manual_seed(seq);  // the same tensors on every rank
            const int64_t b = 2, h = 8, d = 8;
            const double scale = 1.0 / std::sqrt(static_cast<double>(d));
            const Tensor q = at::randn({b, h, seq, d}, at::kDouble).requires_grad_(),
                         k = at::randn({b, kv_heads, seq, d}, at::kDouble).requires_grad_(),
                         v = at::randn({b, kv_heads, seq, d}, at::kDouble).requires_grad_(),
                         g = at::randn({b, h, seq, d}, at::kDouble);
            // Sample 0 real up to 1 token into the first chunk, sample 1 up to 3/4 of the sequence.
            Tensor pad;
            if (padded) {
              pad = at::ones({b, seq}, at::kLong);
              pad[0].narrow(0, 1, seq - 1).zero_();
              pad[1].narrow(0, seq * 3 / 4, seq - seq * 3 / 4).zero_();
            }
            const Tensor whole = whole_attention(q, k.repeat_interleave(h / kv_heads, 1),
                                                 v.repeat_interleave(h / kv_heads, 1), causal, scale, pad);
            (whole * g).sum().backward();
            const Tensor pos = smp_nn::context_parallel_positions(seq, cp, rank, "parallel.cp");
            const auto mine = [&](const Tensor& t) { return t.detach().index_select(2, pos); };
            const Tensor my_pad = padded ? pad.index_select(1, pos) : Tensor();
            const Tensor qr = mine(q).requires_grad_(), kr = mine(k).requires_grad_(), vr = mine(v).requires_grad_();
            if (form == Form::AllToAll && kv_heads % cp != 0) {
              try {
                smp_nn::ulysses_attention(qr, kr, vr, seq, comm, causal, scale, "parallel.cp_mode");
                ++failures;
                std::fprintf(stderr, "rank %d of cp %d: %s: accepted kv heads cp does not divide\n", rank, cp,
                             name.c_str());
              } catch (const smp::sdk::Error& e) {
                if (std::string(e.what()).find("parallel.cp_mode: the all-to-all form splits the heads over cp") ==
                    std::string::npos) {
                  ++failures;
                  std::fprintf(stderr, "rank %d: unexpected message: %s\n", rank, e.what());
                }
              }
              continue;
            }
            const Tensor out =
                form == Form::Ring
                    ? smp_nn::ring_attention(qr, kr, vr, seq, comm, causal, scale, my_pad)
                    : smp_nn::ulysses_attention(qr, kr, vr, seq, comm, causal, scale, "parallel.cp_mode", my_pad);
            (out * mine(g)).sum().backward();
            check(name + " output", out.detach(), mine(whole));
            check(name + " dq", qr.grad(), mine(q.grad()));
            check(name + " dk", kr.grad(), mine(k.grad()));
            check(name + " dv", vr.grad(), mine(v.grad()));
          }
  rdv->shutdown(std::chrono::seconds(60));
  return failures;
}

// Forks cp ranks (before this process does any intra-op work) and returns
// their exit codes.
std::vector<int> run_ring(int cp) {
  const int port = smp::find_free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < cp; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 3;
      try {
        code = std::min(run_rank(r, cp, port), 100);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d of cp %d: %s\n", r, cp, e.what());
      }
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

TEST(ContextParallelAttention, RingAndAllToAllEqualWholeAttentionOverRealRanks) {
  for (const int cp : {2, 4}) {
    const std::vector<int> codes = run_ring(cp);
    for (size_t r = 0; r < codes.size(); ++r)
      EXPECT_EQ(codes[r], 0) << "rank " << r << " of cp " << cp << " (its messages are above)";
  }
}

}  // namespace
