// In-process Rendezvous behaviour: one-rank worlds, argument errors, and the
// messages for a busy port and an unreachable master.
#include <smp/error.h>

#include "comm/communicator.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "comm/comm_handle.h"
#include "error_of.h"
#include "proc_util.h"

namespace {

using namespace std::chrono_literals;

std::string error_of(const std::function<void()>& f) { return smp_test::error_of<smp::Error>(f); }

TEST(RendezvousTest, SingleRankWorld) {
  const int port = smp_test::free_port();
  auto rdv = smp::Rendezvous::connect("127.0.0.1", port, 0, 1, 10s);
  EXPECT_EQ(rdv->rank(), 0);
  EXPECT_EQ(rdv->world_size(), 1);
  rdv->set("k", "v");
  EXPECT_EQ(rdv->get("k"), "v");
  auto c = rdv->new_communicator("tp", "tp.0", {0}, smp::CommOptions{});
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->axis(), "tp");
  ASSERT_NE(c->handle(), nullptr);
  EXPECT_EQ(c->handle()->comm, c.get());
  at::Tensor t = at::arange(6, at::kFloat);
  c->allreduce(t)->wait();
  EXPECT_TRUE(at::equal(t, at::arange(6, at::kFloat)));
  at::Tensor out = at::empty({6}, at::kFloat);
  c->allgather(t, out)->wait();
  EXPECT_TRUE(at::equal(out, t));
  c->reduce_scatter(t, out)->wait();
  EXPECT_TRUE(at::equal(out, t));
  EXPECT_EQ(c->stats().calls.at("allreduce"), 1);
  EXPECT_EQ(c->stats().total_analytic(), 0);
  c->barrier();
  // Argument errors name the op, axis and ranks.
  at::Tensor bad = at::empty({5}, at::kFloat);
  std::string m = error_of([&] { c->allgather(t, bad); });
  EXPECT_NE(m.find("invalid allgather on axis 'tp' (group 'tp.0', world ranks [0])"), std::string::npos) << m;
  m = error_of([&] { c->send(t, 0, 1); });
  EXPECT_NE(m.find("peer 0 is not another group rank"), std::string::npos) << m;
  m = error_of([&] { c->alltoall(t, out, {5}, {6}); });
  EXPECT_NE(m.find("in_splits sum to 5 but in has 6 rows"), std::string::npos) << m;
  m = error_of([&] { c->broadcast(t, 1); });
  EXPECT_NE(m.find("root 1 is not a group rank"), std::string::npos) << m;
  // Membership errors.
  m = error_of([&] { rdv->new_communicator("dp", "dp.0", {1}, smp::CommOptions{}); });
  EXPECT_NE(m.find("outside the world of 1"), std::string::npos) << m;
  m = error_of([&] { rdv->new_communicator("tp", "tp.0", {0}, smp::CommOptions{}); });
  EXPECT_NE(m.find("already used"), std::string::npos) << m;
  rdv->shutdown(1s);
}

TEST(RendezvousTest, BusyPortIsAClearError) {
  const int port = smp_test::free_port();
  auto first = smp::Rendezvous::connect("127.0.0.1", port, 0, 1, 10s);
  std::string m = error_of([&] { smp::Rendezvous::connect("127.0.0.1", port, 0, 1, 2s); });
  EXPECT_NE(m.find("rendezvous at 127.0.0.1:" + std::to_string(port) + " failed on world rank 0 of 1 (hosting the store)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("--master-port"), std::string::npos) << m;
}

TEST(RendezvousTest, UnreachableMasterTimesOut) {
  const int port = smp_test::free_port();
  const auto t0 = std::chrono::steady_clock::now();
  std::string m = error_of([&] { smp::Rendezvous::connect("127.0.0.1", port, 1, 2, 1500ms); });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(m.find("failed on world rank 1 of 2"), std::string::npos) << m;
  EXPECT_NE(m.find("could not reach world rank 0"), std::string::npos) << m;
  EXPECT_LT(s, 10.0);
}

TEST(RendezvousTest, InvalidArguments) {
  EXPECT_NE(error_of([] { smp::Rendezvous::connect("127.0.0.1", 1234, 2, 2, 1s); }).find("invalid rank 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { smp::Rendezvous::connect("127.0.0.1", 0, 0, 1, 1s); }).find("invalid master port"),
            std::string::npos);
}

}  // namespace
