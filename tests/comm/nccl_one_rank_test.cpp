// NCCL once, on the GPU machine's one GPU: a one-rank group at the c10d
// boundary (two ranks cannot share a GPU under NCCL, so the shared-GPU jobs
// never reach it). Checks that the communicator is created and that a wait is
// stream-ordered: work queued on the current stream after wait() sees the
// collective's result. Skips without CUDA or without NCCL in this LibTorch.
#include "comm/c10d_compat.h"

#include <smp/process_env.h>

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <chrono>

namespace {

using namespace std::chrono_literals;
namespace c10d = smp::c10d_compat;

TEST(NcclOneRank, CreatesTheGroupAndWaitsAreStreamOrdered) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA here (a CPU-only LibTorch, or no GPU on this machine)";
  if (!c10d::has_nccl()) GTEST_SKIP() << "this LibTorch (" << c10d::torch_version() << ") has no NCCL";
  auto store = c10d::connect_tcp_store("127.0.0.1", smp::find_free_port(), /*is_server=*/true, 1, 60s);
  c10d::BackendOptions options;
  options.timeout = 60s;
  options.cuda = true;
  options.master_addr = "127.0.0.1";
  auto nccl = c10d::make_backend(*store, "nccl-one-rank/", 0, 1, options);
  ASSERT_STREQ(nccl->name(), "nccl");
  const auto cuda = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  const int64_t n = int64_t{1} << 22;
  at::Tensor in = at::arange(n, cuda);
  at::Tensor out = at::full({n}, -1.0f, cuda);
  // NCCL writes `out` on its own stream; the doubling below is queued on the
  // current stream after wait(), so it must see the gathered values.
  auto work = nccl->allgather(in, out);
  work->wait();
  at::Tensor doubled = out * 2;
  EXPECT_TRUE(at::equal(doubled.cpu(), at::arange(n, at::kFloat) * 2));
  EXPECT_TRUE(work->ready());
  at::Tensor sum = at::full({1024}, 3.0f, cuda);
  auto reduced = nccl->allreduce(sum, smp::ReduceOp::Sum);
  reduced->wait();
  EXPECT_TRUE(at::equal((sum + 1).cpu(), at::full({1024}, 4.0f)));
  auto bcast = nccl->broadcast(sum, 0);
  bcast->wait();
  EXPECT_TRUE(at::equal(sum.cpu(), at::full({1024}, 3.0f)));
}

}  // namespace
