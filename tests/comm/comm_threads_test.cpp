// Two ranks as threads of this process over a real store, Gloo and shared
// memory: the bytes counted for a known all-reduce and send are exactly the
// bytes moved, once; a collective whose peer never comes fails with the one
// wait's message; the rendezvous' barrier names the rank that never arrived,
// and the shutdown barrier only warns.
#include "comm/communicator.h"
#include "comm/wait.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "proc_util.h"

#include <functional>
#include <thread>

namespace {

using namespace std::chrono_literals;

// Runs f(rank, rendezvous) on two threads joined to one job; the first
// failure of either is reported by the test.
void two_ranks(const std::function<void(int, smp::Rendezvous&)>& f) {
  const int port = smp_test::free_port();
  std::string errors[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r)
    ranks[r] = std::thread([&, r] {
      try {
        auto rdv = smp::Rendezvous::connect("127.0.0.1", port, r, 2, 30s);
        f(r, *rdv);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

smp::CommOptions options(std::chrono::milliseconds timeout, int64_t shm_bytes) {
  smp::CommOptions o;
  o.timeout = timeout;
  o.shm_slot_bytes = shm_bytes;
  return o;
}

using Sent = std::map<std::string, std::map<std::string, int64_t>>;

// What each transport counted is what it moved: an all-reduce through shared
// memory writes each byte of the tensor once; a send its message. Nothing is
// counted twice (under a second transport or op), and the analytic count is
// the ring's (n = 2: B) and the message's.
TEST(CommThreadsTest, TheBytesOfAKnownAllReduceAndSendAreCountedOnce) {
  constexpr int64_t kNumel = int64_t{1} << 18, kBytes = kNumel * 4;  // 1 MiB of floats
  two_ranks([&](int r, smp::Rendezvous& rdv) {
    auto c = rdv.new_communicator("world", "world.bytes", {0, 1}, options(30s, int64_t{4} << 20));
    ASSERT_EQ(c->transport("allreduce", at::kCPU), "shm");
    c->reset_stats();
    at::Tensor t = at::ones({kNumel}, at::kFloat);
    c->allreduce(t)->wait();
    EXPECT_TRUE(at::equal(t, at::full({kNumel}, 2.0f)));
    smp::CommStats st = c->stats();
    EXPECT_EQ(st.sent, (Sent{{"shm", {{"allreduce", kBytes}}}})) << "rank " << r;
    EXPECT_EQ(st.analytic["allreduce"], kBytes) << "rank " << r;
    EXPECT_EQ(st.calls["allreduce"], 1) << "rank " << r;

    c->reset_stats();
    if (r == 0) {
      c->send(at::ones({kNumel}, at::kFloat), 1, 7)->wait();
    } else {
      at::Tensor got = at::zeros({kNumel}, at::kFloat);
      c->recv(got, 0, 7)->wait();
      EXPECT_TRUE(at::equal(got, at::ones({kNumel}, at::kFloat)));
    }
    st = c->stats();
    if (r == 0) {
      EXPECT_EQ(st.sent, (Sent{{"shm", {{"send", kBytes}}}}));
      EXPECT_EQ(st.analytic, (std::map<std::string, int64_t>{{"send", kBytes}}));
    } else {
      EXPECT_EQ(st.sent, Sent{});
      EXPECT_EQ(st.analytic, (std::map<std::string, int64_t>{{"recv", 0}}));
    }
    c->barrier();  // rank 0's outbox lives until rank 1 took the message
  });
}

// After one all-reduce together, rank 1 calls no more: rank 0's second
// all-reduce fails at its deadline, naming the collective, the time and the
// missing rank, in the communicator's frame.
TEST(CommThreadsTest, ACollectiveWhosePeerNeverComesFailsWithTheWaitsMessage) {
  two_ranks([&](int r, smp::Rendezvous& rdv) {
    auto c = rdv.new_communicator("world", "world.late", {0, 1}, options(500ms, int64_t{1} << 20));
    at::Tensor t = at::ones({16}, at::kFloat);
    c->allreduce(t)->wait();
    if (r == 1) {
      rdv.arrive("rank 0 is done");
      rdv.wait_for_all("rank 0 is done", 30s, "both");
      return;
    }
    std::string error;
    try {
      c->allreduce(t)->wait();
    } catch (const smp::Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find("allreduce(sum) on axis 'world' (group 'world.late'"), std::string::npos) << error;
    EXPECT_NE(error.find("(timed out; timeout 500 ms)"), std::string::npos) << error;
    EXPECT_NE(error.find("timed out after 500 ms waiting for a shared-memory all-reduce; missing: group rank 1"),
              std::string::npos)
        << error;
    rdv.arrive("rank 0 is done");
    rdv.wait_for_all("rank 0 is done", 30s, "both");
  });
}

TEST(CommThreadsTest, TheRendezvousBarrierNamesTheRankThatNeverArrived) {
  two_ranks([&](int r, smp::Rendezvous& rdv) {
    if (r == 0) {
      rdv.arrive("b");
      std::string error;
      try {
        rdv.wait_for_all("b", 300ms, "every rank's part");
      } catch (const smp::WaitFailed& e) {
        error = e.what();
        EXPECT_TRUE(e.timed_out());
      }
      EXPECT_EQ(error, "timed out after 300 ms waiting for every rank's part; missing: world rank 1");
      rdv.set("rank 0 timed out", "1");
      rdv.wait_for_all("b", 30s, "every rank's part");  // rank 1 arrives now
    } else {
      rdv.get("rank 0 timed out");
      rdv.arrive("b");
    }
    // Rank 1 never calls shutdown: rank 0's barrier warns and returns (it runs in destructors).
    if (r == 0) EXPECT_NO_THROW(rdv.shutdown(200ms));
  });
}

}  // namespace
