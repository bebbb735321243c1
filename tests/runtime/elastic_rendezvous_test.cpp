// The elastic rendezvous (tools/rendezvous/): its rules, with time passed in
// (membership.h), its messages as a peer could send them (messages.h), and
// the server and a client over loopback TCP.
#include "rendezvous/client.h"
#include "rendezvous/membership.h"
#include "rendezvous/server.h"

#include <smp/process_env.h>

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace smp::rdzv {
namespace {

Message hello(const std::string& name, int nproc, int min, int max, int port = 1000, int restarts = 0,
              const std::string& job = "job-1") {
  Message m;
  m.type = "hello", m.name = name, m.nproc = nproc, m.port = port, m.min_nodes = min, m.max_nodes = max;
  m.max_restarts = restarts, m.job = job;
  return m;
}
Message of(const std::string& type, int round = 0, int64_t step = 0, int port = 2000) {
  Message m;
  m.type = type, m.round = round, m.step = step, m.port = port;
  return m;
}
// The messages of one type in `out`, by recipient.
std::map<int, Message> sent(const std::vector<Outgoing>& out, const std::string& type) {
  std::map<int, Message> r;
  for (const Outgoing& o : out)
    if (o.message.type == type) r[o.to] = o.message;
  return r;
}

MembershipOptions options(int min, int max) {
  MembershipOptions o;
  o.min_nodes = min, o.max_nodes = max, o.settle_s = 5, o.join_timeout_s = 60, o.keepalive_s = 15;
  return o;
}

// Two nodes a (id 1) and b (id 2), 2 ranks each, in round 0.
Membership two_running(MembershipOptions o) {
  Membership m(o);
  m.start(0);
  m.connected(1, "10.0.0.1", 0);
  m.connected(2, "10.0.0.2", 0);
  m.receive(1, hello("a", 2, o.min_nodes, o.max_nodes, 1111, o.max_restarts), 0);
  auto out = m.receive(2, hello("b", 2, o.min_nodes, o.max_nodes, 2222, o.max_restarts), 0.1);
  if (sent(out, "round").size() != 2) out = m.tick(10);
  EXPECT_EQ(sent(out, "round").size(), 2u);
  return m;
}

TEST(Rendezvous, TheFirstRoundWaitsTheSettleTimeAfterMinThenStarts) {
  Membership m(options(1, 2));
  m.start(0);
  m.connected(1, "10.0.0.1", 0);
  EXPECT_TRUE(sent(m.receive(1, hello("a", 2, 1, 2, 1111), 1), "round").empty());
  EXPECT_TRUE(sent(m.tick(5.9), "round").empty());
  const auto rounds = sent(m.tick(6.0), "round");
  ASSERT_EQ(rounds.size(), 1u);
  const Message& r = rounds.at(1);
  EXPECT_EQ(r.round, 0);
  EXPECT_EQ(r.world, 2);
  EXPECT_EQ(r.node_rank, 0);
  EXPECT_EQ(r.master_addr, "10.0.0.1");
  EXPECT_EQ(r.port, 1111);
}

TEST(Rendezvous, StartsAtOnceWhenMaxAreThereWithNodeRanksByArrival) {
  Membership m(options(1, 2));
  m.start(0);
  m.connected(1, "10.0.0.1", 0);
  m.connected(2, "10.0.0.2", 0);
  m.receive(1, hello("a", 2, 1, 2), 0);
  const auto rounds = sent(m.receive(2, hello("b", 2, 1, 2), 0.5), "round");
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds.at(1).node_rank, 0);
  EXPECT_EQ(rounds.at(2).node_rank, 1);
  EXPECT_EQ(rounds.at(2).world, 4);
  EXPECT_EQ(rounds.at(2).members, (std::vector<std::string>{"a", "b"}));
}

TEST(Rendezvous, MinNotReachedEndsTheJobNamingTheNodesPresent) {
  Membership m(options(3, 3));
  m.start(0);
  m.receive(1, hello("a", 1, 3, 3), 1);
  m.receive(2, hello("b", 1, 3, 3), 2);
  for (double t = 10; t < 60; t += 10) m.receive(1, of("ping"), t), m.receive(2, of("ping"), t);  // alive
  EXPECT_TRUE(sent(m.tick(59), "refuse").empty());
  const auto refused = sent(m.tick(60), "refuse");
  ASSERT_EQ(refused.size(), 2u);
  EXPECT_NE(refused.at(1).why.find("only 2 of the 3 nodes"), std::string::npos) << refused.at(1).why;
  EXPECT_NE(refused.at(1).why.find("present: a, b"), std::string::npos) << refused.at(1).why;
  EXPECT_EQ(m.ended(), 1);
}

TEST(Rendezvous, ALostNodeStopsTheRoundAndTheRestReformAtOnce) {
  Membership m = two_running(options(1, 2));
  const auto stops = sent(m.lost(2, "its launcher's connection closed", 20), "stop");
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops.at(1).round, 0);
  const auto rounds = sent(m.receive(1, of("ready", 0, 0, 3333), 21), "round");
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds.at(1).round, 1);
  EXPECT_EQ(rounds.at(1).world, 2);
  EXPECT_EQ(rounds.at(1).previous_world, 4);
  EXPECT_EQ(rounds.at(1).port, 3333);  // the fresh port it said it has
  EXPECT_NE(rounds.at(1).reason.find("lost node b"), std::string::npos) << rounds.at(1).reason;
}

TEST(Rendezvous, ASilentNodeIsLostAfterTheKeepalive) {
  Membership m = two_running(options(1, 2));
  m.receive(1, of("ping"), 14);
  EXPECT_TRUE(sent(m.tick(14.9), "stop").empty());
  const auto stops = sent(m.tick(15.5), "stop");  // b last spoke at 0.1
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_NE(stops.at(1).why.find("silent"), std::string::npos) << stops.at(1).why;
}

TEST(Rendezvous, AReturningNodeJoinsAtTheNextCommittedCheckpoint) {
  Membership m = two_running(options(1, 2));
  m.lost(2, "gone", 20);
  m.receive(1, of("ready"), 21);  // round 1: a alone
  m.connected(3, "10.0.0.2", 30);
  EXPECT_TRUE(sent(m.receive(3, hello("b", 2, 1, 2, 4444), 30), "stop").empty());
  m.receive(1, of("committed", 0, 15), 31);  // a checkpoint before? No: this one admits it.
  EXPECT_EQ(m.round(), 1);
  const auto rounds = sent(m.receive(1, of("ready", 0, 0, 5555), 32), "round");
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds.at(1).round, 2);
  EXPECT_EQ(rounds.at(1).node_rank, 0);  // the survivor stays node 0 (its rank 0 holds the store)
  EXPECT_EQ(rounds.at(3).node_rank, 1);
  EXPECT_EQ(rounds.at(3).world, 4);
  EXPECT_EQ(rounds.at(3).previous_world, 2);
  EXPECT_NE(rounds.at(3).reason.find("checkpoint of step 15"), std::string::npos) << rounds.at(3).reason;
}

TEST(Rendezvous, GrowNowStopsAtOnce) {
  MembershipOptions o = options(1, 2);
  o.grow_now = true;
  Membership m(o);
  m.start(0);
  Message a = hello("a", 2, 1, 2), b = hello("b", 2, 1, 2);
  a.grow_now = b.grow_now = true;
  m.receive(1, a, 0);
  EXPECT_EQ(sent(m.tick(6), "round").size(), 1u);  // a alone, after the settle time
  EXPECT_EQ(sent(m.receive(3, b, 30), "stop").size(), 1u);
  Message c = hello("c", 2, 1, 2);  // --elastic-grow checkpoint: not this job's rule
  EXPECT_NE(sent(m.receive(4, c, 31), "refuse").at(4).why.find("--elastic-grow checkpoint differs"), std::string::npos);
}

TEST(Rendezvous, FailuresCountAgainstTheNodeUntilItLeaves) {
  MembershipOptions o = options(1, 2);
  o.max_restarts = 1;
  Membership m = two_running(o);
  ASSERT_EQ(m.round(), 0);
  // a's workers fail: both stop, the same two re-form (a restart of a).
  m.receive(1, of("failed", 0), 20);
  m.receive(1, of("ready"), 20.5);
  auto rounds = sent(m.receive(2, of("ready"), 21), "round");
  ASSERT_EQ(rounds.size(), 2u);
  EXPECT_EQ(rounds.at(1).world, 4);
  // Again: past --max-restarts 1, a leaves and b goes on alone.
  m.receive(1, of("failed", 1), 30);
  m.receive(1, of("ready"), 30.5);
  const auto out = m.receive(2, of("ready"), 31);
  ASSERT_EQ(sent(out, "refuse").size(), 1u);
  EXPECT_NE(sent(out, "refuse").at(1).why.find("more than --max-restarts 1"), std::string::npos);
  rounds = sent(out, "round");
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds.at(2).world, 2);
  EXPECT_EQ(rounds.at(2).node_rank, 0);
}

TEST(Rendezvous, AFailureThatALossExplainsIsNotCounted) {
  Membership m = two_running(options(1, 2));  // --max-restarts 0
  m.receive(1, of("failed", 0), 20);          // a's ranks fail as b's host dies ...
  m.lost(2, "its launcher's connection closed", 20.1);  // ... which the rendezvous hears just after
  const auto out = m.receive(1, of("ready"), 21);
  EXPECT_TRUE(sent(out, "refuse").empty());
  const auto rounds = sent(out, "round");
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_NE(rounds.at(1).reason.find("lost node b"), std::string::npos) << rounds.at(1).reason;
}

TEST(Rendezvous, TheJobFinishesWhenEveryActiveNodeIsDone) {
  Membership m = two_running(options(1, 2));
  EXPECT_TRUE(sent(m.receive(1, of("done", 0), 20), "finish").empty());
  EXPECT_EQ(sent(m.receive(2, of("done", 0), 21), "finish").size(), 2u);
  EXPECT_EQ(m.ended(), 0);
}

TEST(Rendezvous, NodesThatDoNotMatchTheJobAreRefusedByName) {
  Membership m(options(1, 2));
  m.start(0);
  auto out = m.receive(1, hello("a", 2, 1, 3), 0);
  ASSERT_EQ(sent(out, "refuse").size(), 1u);
  EXPECT_NE(sent(out, "refuse").at(1).why.find("--nnodes 1:3 differs from the job's 1:2"), std::string::npos);
  m.receive(2, hello("b", 2, 1, 2), 0);
  out = m.receive(3, hello("c", 4, 1, 2), 0);
  EXPECT_NE(sent(out, "refuse").at(3).why.find("--nproc-per-node 4 differs"), std::string::npos);
  out = m.receive(4, of("ready"), 0);  // before its hello
  EXPECT_NE(sent(out, "refuse").at(4).why.find("hello"), std::string::npos);
  // The job's rules are the rendezvous's, and its job the first node's.
  out = m.receive(5, hello("d", 2, 1, 2, 1000, /*restarts=*/3), 0);
  EXPECT_NE(sent(out, "refuse").at(5).why.find("--max-restarts 3 differs from the rendezvous's 0"), std::string::npos);
  out = m.receive(6, hello("e", 2, 1, 2, 1000, 0, "another-job"), 0);
  EXPECT_NE(sent(out, "refuse").at(6).why.find("its job (the worker's arguments and job file) differs"),
            std::string::npos);
}

// What the rendezvous sends stays within what a launcher takes, however
// many nodes and however long the reasons: lists are cut, not the message.
TEST(RendezvousMessages, LongListsAndReasonsAreCutToWhatALauncherTakes) {
  Message r;
  r.type = "round", r.round = 1, r.nnodes = 4000, r.node_rank = 3999, r.nproc = 8, r.world = 32000;
  r.master_addr = "10.0.0.1", r.port = 29500, r.name = std::string(kMaxName - 8, 'n');
  for (int i = 0; i < 4000; ++i) r.members.push_back(std::string(kMaxName - 8, 'a' + i % 26));
  r.reason = std::string(100000, 'x');
  const std::string line = encode(r);
  EXPECT_LE(line.size(), kMaxLine);
  const Message back = decode(line);
  EXPECT_EQ(back.members.size(), kMaxMembers);
  EXPECT_LE(back.reason.size(), kMaxWhy);
  EXPECT_EQ(back.name, r.name);
  Message refuse;
  refuse.type = "refuse", refuse.why = std::string(5000, 'y');
  EXPECT_LE(decode(encode(refuse)).why.size(), kMaxWhy);
}

TEST(RendezvousMessages, WhatAPeerSendsIsCheckedBeforeItIsTaken) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "not JSON"},
      {"[1,2]", "not a JSON object"},
      {R"({"t":"nope"})", "unknown message type"},
      {R"({"t":"hello","name":"a","nproc":0,"port":1,"min":1,"max":1})", "\"nproc\""},
      {R"({"t":"hello","name":"a","nproc":1,"port":70000,"min":1,"max":1})", "\"port\""},
      {R"({"t":"hello","name":"a\u0001","nproc":1,"port":1,"min":1,"max":1})", "control character"},
      {R"({"t":"hello","name":"","nproc":1,"port":1,"min":1,"max":1})", "\"name\""},
      {R"({"t":"ready","port":"1"})", "expected an integer"},
      {R"({"t":"committed","step":-1})", "\"step\""},
      {R"({"t":"round","round":0,"nnodes":2,"node_rank":2,"nproc":1,"world":2,"master_addr":"x","port":1,"members":["a","b"],"previous_world":0})",
       "\"node_rank\""},
      {R"({"t":"round","round":0,"nnodes":2,"node_rank":0,"nproc":1,"world":3,"master_addr":"x","port":1,"members":["a","b"],"previous_world":0})",
       "\"world\""},
      {std::string(kMaxLine + 1, ' '), "longer than"},
  };
  for (const auto& [line, expect] : bad) {
    try {
      decode(line);
      ADD_FAILURE() << "taken: " << line.substr(0, 80);
    } catch (const Refused& e) {
      EXPECT_NE(std::string(e.what()).find(expect), std::string::npos) << line.substr(0, 80) << " -> " << e.what();
    }
  }
  std::string pending;
  const std::string flood(kMaxLine + 10, 'x');
  EXPECT_THROW(take_lines(pending, flood.data(), flood.size()), Refused);
  Message r;
  r.type = "round", r.round = 3, r.nnodes = 2, r.node_rank = 1, r.nproc = 2, r.world = 4, r.master_addr = "10.1.1.1";
  r.port = 29500, r.members = {"a", "b"}, r.reason = "lost node c", r.previous_world = 6;
  const Message back = decode(encode(r));
  EXPECT_EQ(back.world, 4);
  EXPECT_EQ(back.members, r.members);
  EXPECT_EQ(back.reason, r.reason);
}

// The server in a child process and two clients over loopback: the first
// round reaches both; one leaves and the other is told to stop.
TEST(RendezvousServer, TwoClientsMeetAndALeavingOneStopsTheRound) {
  const int port = smp::find_free_port("127.0.0.1");
  std::string error;
  bool in_use = false;
  const int fd = listen_on("127.0.0.1", port, &error, &in_use);
  ASSERT_GE(fd, 0) << error;
  const pid_t server = ::fork();
  if (server == 0) {
    MembershipOptions o = options(1, 2);
    o.settle_s = 0.2;
    ::_exit(serve(fd, o));
  }
  ::close(fd);
  auto wait_for = [](Client& c, const std::string& type) {
    for (int i = 0; i < 100; ++i) {
      for (const Message& m : c.receive())
        if (m.type == type) return m;
      c.tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return Message{};
  };
  {
    Client a("127.0.0.1", port, 15), b("127.0.0.1", port, 15);
    a.connect(5);
    b.connect(5);
    a.send(hello("a", 1, 1, 2, 1234));
    b.send(hello("b", 1, 1, 2, 1235));
    const Message ra = wait_for(a, "round"), rb = wait_for(b, "round");
    EXPECT_EQ(ra.world, 2);
    EXPECT_EQ(ra.node_rank + rb.node_rank, 1);
    EXPECT_EQ(ra.master_addr, "127.0.0.1");
    // A second listener on the endpoint cannot bind: that launcher is a client only.
    bool taken = false;
    EXPECT_LT(listen_on("127.0.0.1", port, &error, &taken), 0);
    EXPECT_TRUE(taken);
  }  // both connections close: the job ends without them
  ::kill(server, SIGTERM);
  int status = 0;
  ::waitpid(server, &status, 0);
  Client late("127.0.0.1", port, 15);
  EXPECT_THROW(late.connect(0.5), Lost);
}

}  // namespace
}  // namespace smp::rdzv
