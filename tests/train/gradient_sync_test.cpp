// GradientSync over real groups: ranks are threads of this process, each with
// its own Rendezvous client, DeviceMesh and ProcessGroups (c10d Gloo, and
// shared memory for the all-reduces). Every rank's gradient of a parameter is
// (world rank + 1) x a fixed pattern, so the expected sum over any group is
// known: the groups come from the placements alone.
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "memory/gradient_sync.h"
#include "mesh/placement.h"
#include "plugin/placement_abi.h"

#include <smp/mesh.h>
#include <smp/process_env.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <mutex>
#include <thread>

namespace {

using namespace std::chrono_literals;
using smp::Axis;

struct ParamSpec {
  const char* name;
  std::vector<smp_placement> placements;
  std::vector<int64_t> shape;
};

smp_placement pl(const char* axis, smp_placement_kind kind, int dim = -1) {
  return {SMP_PLACEMENT_STRUCT_SIZE, axis, kind, dim};
}

// Runs `body(rank)` on `world` threads, each with its own mesh and groups.
void run_ranks(int world, int dp, int tp, int ep,
               const std::function<void(int, smp::ProcessGroups&, const smp::DeviceMesh&)>& body) {
  const int port = smp::find_free_port();
  std::vector<std::thread> threads;
  std::mutex mu;
  std::vector<std::string> errors;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      try {
        auto rdv = smp::Rendezvous::connect("127.0.0.1", port, r, world, 60s);
        smp::DeviceMesh mesh(world, r, 1, dp, tp, "pp,dp,tp", ep);
        smp::CommOptions opts;
        opts.timeout = 60s;
        smp::ProcessGroups groups(mesh, rdv, opts);
        body(r, groups, mesh);
        groups.get(Axis::World).barrier();
        rdv->shutdown(60s);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("rank " + std::to_string(r) + ": " + e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
}

at::Tensor pattern(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return at::arange(n, at::kFloat).add_(1).reshape(shape);
}

// Builds each parameter, derives its groups from placements (the runtime's
// own synced_parameter), runs one backward with gradient (rank + 1) x pattern, syncs, and
// returns .grad per parameter.
std::vector<at::Tensor> sync_once(int rank, smp::ProcessGroups& groups, const std::vector<ParamSpec>& specs,
                                  int64_t bucket_bytes) {
  std::vector<at::Tensor> params;
  std::vector<smp::SyncedParameter> synced;
  for (const auto& s : specs) {
    at::Tensor p = at::zeros(s.shape, at::kFloat).requires_grad_(true);
    auto placements = smp::placements_from_abi(s.placements.data(), s.placements.size(), p.dim(), s.name);
    synced.push_back(smp::synced_parameter(p, placements, groups));  // what the runtime calls
    params.push_back(p);
  }
  smp::GradientSync sync(synced, bucket_bytes);
  sync.begin_step();
  at::Tensor loss = at::zeros({}, at::kFloat);
  for (auto& p : params) loss = loss + (p * pattern(p.sizes().vec()) * static_cast<float>(rank + 1)).sum();
  loss.backward();
  sync.finish_step();
  std::vector<at::Tensor> grads;
  for (auto& p : params) grads.push_back(p.grad().clone());
  return grads;
}

// Sum of (r + 1) over the world ranks in `ranks`.
float weight(const std::vector<int>& ranks) {
  float w = 0;
  for (int r : ranks) w += static_cast<float>(r + 1);
  return w;
}

TEST(GradientSync, GroupsComeFromPlacementsDp2Tp2) {
  // A tp shard replicated over dp, a tp-partial norm, a plain replicated bias.
  const std::vector<ParamSpec> specs = {
      {"w", {pl("tp", SMP_PLACEMENT_SHARD, 0)}, {4, 3}},
      {"ln", {pl("tp", SMP_PLACEMENT_PARTIAL_GRAD)}, {3}},
      {"b", {}, {5}},
  };
  for (int64_t bucket : {int64_t{0}, int64_t{16}}) {  // one reduction after backward / small overlapped buckets
    run_ranks(4, 2, 2, 1, [&](int rank, smp::ProcessGroups& groups, const smp::DeviceMesh& mesh) {
      auto g = sync_once(rank, groups, specs, bucket);
      const float dp_sum = weight(mesh.group(Axis::DP));
      std::vector<int> dp_tp;  // the partial norm: summed over dp, then tp = every rank here
      for (int r = 0; r < 4; ++r) dp_tp.push_back(r);
      EXPECT_TRUE(at::allclose(g[0], pattern({4, 3}) * dp_sum)) << "rank " << rank << " tp shard";
      EXPECT_TRUE(at::allclose(g[1], pattern({3}) * weight(dp_tp))) << "rank " << rank << " tp-partial norm";
      EXPECT_TRUE(at::allclose(g[2], pattern({5}) * dp_sum)) << "rank " << rank << " replicated";
    });
  }
}

// Sums over a partial-gradient axis are bucketed: several tp-partial norms of
// two dtypes cost one all-reduce per dtype on the tp group, not one each.
TEST(GradientSync, PartialGradientSumsAreOneCollectivePerGroupAndDtype) {
  run_ranks(2, 1, 2, 1, [&](int rank, smp::ProcessGroups& groups, const smp::DeviceMesh&) {
    std::vector<at::Tensor> params;
    std::vector<smp::SyncedParameter> synced;
    for (int i = 0; i < 5; ++i) {
      const at::ScalarType dtype = i < 3 ? at::kFloat : at::kDouble;
      at::Tensor p = at::zeros({3 + i}, dtype).requires_grad_(true);
      const smp_placement partial = pl("tp", SMP_PLACEMENT_PARTIAL_GRAD);
      auto placements = smp::placements_from_abi(&partial, 1, p.dim(), "norm" + std::to_string(i));
      synced.push_back(smp::synced_parameter(p, placements, groups));
      params.push_back(p);
    }
    smp::GradientSync sync(synced, 0);
    sync.begin_step();
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (auto& p : params) loss = loss + (p.to(at::kDouble) * pattern({p.size(0)}).to(at::kDouble) * (rank + 1)).sum();
    loss.backward();
    smp::Communicator& tp = groups.get(Axis::TP);
    tp.reset_stats();
    sync.finish_step();
    EXPECT_EQ(tp.stats().calls["allreduce"], 2) << "rank " << rank;
    for (auto& p : params)
      EXPECT_TRUE(at::allclose(p.grad().to(at::kFloat), pattern({p.size(0)}) * 3.0f)) << "rank " << rank;
  });
}

TEST(GradientSync, ExpertsAreReducedOverEdpNotDp) {
  // dp 4, ep 2: an expert (sharded over ep) is averaged over the 2 ranks that
  // hold the same experts (dp i and i + 2); the router over all 4.
  const std::vector<ParamSpec> specs = {
      {"router", {}, {6}},
      {"expert", {pl("ep", SMP_PLACEMENT_SHARD, 0)}, {2, 3}},
  };
  run_ranks(4, 4, 1, 2, [&](int rank, smp::ProcessGroups& groups, const smp::DeviceMesh& mesh) {
    auto g = sync_once(rank, groups, specs, 8);
    EXPECT_EQ(mesh.group(Axis::EDP), (std::vector<int>{rank % 2, rank % 2 + 2}));
    EXPECT_TRUE(at::allclose(g[0], pattern({6}) * weight({0, 1, 2, 3}))) << "rank " << rank << " router";
    EXPECT_TRUE(at::allclose(g[1], pattern({2, 3}) * weight(mesh.group(Axis::EDP)))) << "rank " << rank << " expert";
  });
}

// bf16 parameters with fp32 gradients (train.grad_reduce_dtype = "fp32"): each
// microbatch's bf16 .grad is added into an fp32 main buffer, which is what dp
// reduces. The second microbatch's gradient is 1/256 of the first: lost in a bf16
// sum (8 significant bits), kept in fp32.
TEST(GradientSync, Bf16ParametersAccumulateAndReduceInFp32MainGradients) {
  for (int64_t bucket : {int64_t{0}, int64_t{16}}) {
    run_ranks(2, 2, 1, 1, [&](int rank, smp::ProcessGroups& groups, const smp::DeviceMesh&) {
      at::Tensor p = at::zeros({4, 3}, at::kBFloat16).requires_grad_(true);
      smp::SyncedParameter sp = smp::synced_parameter(p, smp::placements_from_abi(nullptr, 0, 2, "p"), groups);
      sp.grad_dtype = at::kFloat;
      sp.expected_grads = 2;
      smp::GradientSync sync({sp}, bucket);
      for (int step = 0; step < 2; ++step) {  // begin_step must clear the main buffer
        sync.begin_step();
        for (float c : {1.0f, 1.0f / 256})
          (p.to(at::kFloat) * pattern({4, 3}) * static_cast<float>(rank + 1) * c).sum().backward();
        sync.finish_step();
        at::Tensor g = sync.gradient(0);
        EXPECT_EQ(g.scalar_type(), at::kFloat);
        EXPECT_TRUE(at::equal(g, pattern({4, 3}) * 3.0f * (1.0f + 1.0f / 256)))
            << "rank " << rank << " step " << step << " bucket " << bucket << "\n" << g;
      }
    });
  }
}

// With buckets, the all-reduces start inside backward (the AccumulateGrad hooks),
// not in finish_step: overlap with the rest of backward is the point of buckets.
TEST(GradientSync, BucketsAreLaunchedDuringBackward) {
  run_ranks(2, 2, 1, 1, [&](int, smp::ProcessGroups& groups, const smp::DeviceMesh&) {
    std::vector<at::Tensor> params;
    std::vector<smp::SyncedParameter> synced;
    for (int i = 0; i < 3; ++i) {
      params.push_back(at::zeros({8}, at::kFloat).requires_grad_(true));
      synced.push_back(smp::synced_parameter(params.back(), smp::placements_from_abi(nullptr, 0, 1, "p"), groups));
    }
    smp::GradientSync sync(synced, /*bucket_bytes=*/32);  // one parameter per bucket
    smp::Communicator& dp = groups.get(Axis::DP);
    for (int step = 0; step < 2; ++step) {  // the hooks must survive the first step's graph
      sync.begin_step();
      dp.reset_stats();
      at::Tensor loss = at::zeros({});
      for (auto& p : params) loss = loss + (p * 2).sum();
      loss.backward();
      auto it = dp.stats().calls.find("allreduce");
      EXPECT_TRUE(it != dp.stats().calls.end() && it->second == 3) << "step " << step << ": launched during backward: "
                                                                   << (it == dp.stats().calls.end() ? 0 : it->second);
      sync.finish_step();
      for (auto& p : params) EXPECT_TRUE(at::equal(p.grad(), at::full({8}, 4.0f)));
    }
  });
}

// ZeRO 2: a bucket of odd-sized parameters (23 elements) is padded to 24 and
// reduce-scattered; each rank holds 12 elements, cut into per-parameter
// segments, which hold the dp sum of exactly their part of each gradient.
TEST(GradientSync, Zero2ReduceScattersPaddedBucketsIntoShardSegments) {
  run_ranks(2, 2, 1, 1, [&](int rank, smp::ProcessGroups& groups, const smp::DeviceMesh&) {
    const std::vector<std::vector<int64_t>> shapes = {{3, 5}, {7}, {1}};
    std::vector<at::Tensor> params;
    std::vector<smp::SyncedParameter> synced;
    for (const auto& shape : shapes) {
      params.push_back(at::zeros(shape, at::kFloat).requires_grad_(true));
      synced.push_back(smp::synced_parameter(params.back(), smp::placements_from_abi(nullptr, 0, 1, "p"), groups));
    }
    smp::GradientSync sync(synced, smp::GradientSyncOptions{1 << 20, 2});
    ASSERT_EQ(sync.layout().size(), 1u);
    EXPECT_EQ(sync.layout()[0].padded, 24);
    EXPECT_EQ(sync.layout()[0].shard, 12);
    smp::Communicator& dp = groups.get(Axis::DP);
    dp.reset_stats();
    sync.begin_step();
    at::Tensor loss = at::zeros({});
    for (auto& p : params) loss = loss + (p * pattern(p.sizes().vec()) * static_cast<float>(rank + 1)).sum();
    loss.backward();
    sync.finish_step();
    const auto segments = smp::shard_segments(sync.layout());
    ASSERT_EQ(segments.size(), sync.segment_gradients().size());
    int64_t covered = 0;
    for (size_t i = 0; i < segments.size(); ++i) {
      const auto& seg = segments[i];
      at::Tensor want = pattern(shapes[seg.param]).reshape(-1).narrow(0, seg.param_begin, seg.length) * 3.0f;
      EXPECT_TRUE(at::equal(sync.segment_gradients()[i], want)) << "rank " << rank << " segment " << i;
      covered += seg.length;
    }
    EXPECT_EQ(covered, rank == 0 ? 12 : 11);  // the padding element is nobody's
    int64_t bytes = 0;
    for (const auto& [op, b] : dp.stats().analytic) bytes += b;
    EXPECT_EQ(bytes, (24 - 12) * 4) << "one reduce-scatter: every slice of the bucket but its own";
  });
}

}  // namespace
