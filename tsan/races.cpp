// What smp's threads share, exercised from several threads at once under
// ThreadSanitizer (scripts/tsan.sh). Exits non-zero (TSan's exit code, 66)
// when TSan reports a race, 3 when a check finds wrong results.
//
// 1. The trace recorder: the training thread moves the step and turns the
//    recording on and off while other threads (communicator callbacks, the
//    checkpoint writer) ask trace::active() and record events.
// 2. One communicator issued on from two threads at once, as the training
//    thread and a checkpoint snapshot or watcher thread do: each call notes
//    the op it is issuing (its name and trace tag) for its own submit.
//    Checks 1 and 2 are faults a review found: before their fixes (3c17270)
//    TSan reports both (scripts/tsan.sh --at 3c17270^).
// 3. The deferred expert weight-gradient pool (deferred_grads_race.cpp): two
//    ranks as threads, each with its training thread and a GPU-style
//    autograd worker thread, deferred tasks run inside all-to-alls that
//    communicator threads complete, their gradients through GradientSync's
//    bucket hooks; gradients must equal those without deferral.
// 4. The asynchronous checkpoint writer (checkpoint_race.cpp): background
//    saves while the training thread reads, updates in place after
//    wait_for_snapshot, saves again, waits for commits; a writer destroyed
//    with a save in flight; each checkpoint must hold the state it was asked for.
//
// Each of 3 and 4 fails with its synchronisation removed
// (scripts/tsan.sh --break NAME, on a copy of the sources; 2 cores, Dec 2026):
//   pool-shared (the pool static, not thread_local): exit 66, 15 reports,
//     "data race .../smp_nn/deferred_grads.hpp:123:14 in
//     smp_nn::start_deferral_chain", others in the pool's deque and
//     GradientSync::launch_ready (the ranks then time out on "dp").
//   writer-no-snapshot (the writer writes the live tensors): exit 66, 8
//     reports, "Read of size 8 ... by thread T28: crc_sse42 ... crc32c.cpp:33
//     <- CheckpointWriter::run ... Previous write ... by main thread:
//     State::update"; and "step-00000009 holds model/p1 = 10..., not the state
//     when the save was asked for (9...)".
//   writer-no-join (wait() detaches the writer thread): exit 66, 4 reports,
//     "data race .../checkpoint.h:78:8 in CheckpointWriter::CheckpointWriter"
//     (a new writer where the last one's thread still writes), memcpy,
//     memset, pthread_cond_destroy; and manifests missing after wait().
// With the sources as they are, no race: smp's code needed no fix for 3 or 4.
#include "base/trace.h"
#include "comm/communicator.h"

#include <ATen/ATen.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

namespace tsan_races {

void deferred_weight_grads();  // deferred_grads_race.cpp
void checkpoint_writer();      // checkpoint_race.cpp

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t n = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) {
    std::perror("tsan_races: no free port");
    std::exit(2);
  }
  close(fd);
  return ntohs(a.sin_port);
}

namespace {

void trace_recorder() {
  std::atomic<int> ready{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> askers;
  for (int k = 0; k < 2; ++k)
    askers.emplace_back([&] {
      ready++;
      while (!stop) {
        smp::trace::Scope scope("tsan", "asked");
        if (smp::trace::active()) smp::trace::complete("tsan", "event", smp::trace::now_us(), smp::trace::now_us());
      }
    });
  while (ready < 2) std::this_thread::yield();
  // The training thread: the step moves on, the recording window opens and closes.
  for (int64_t s = 0; s < 200000; ++s) {
    if (s % 1000 == 0) smp::trace::configure(s % 2000 == 0, 0, "tsan", s + 10, s + 500);
    smp::trace::set_step(s);
  }
  stop = true;
  for (auto& t : askers) t.join();
  std::printf("tsan_races: trace recorder done\n");
}

void one_communicator_two_threads() {
  smp::trace::configure(true, 0, "tsan", 0, 1 << 30);
  smp::trace::set_step(0);
  auto rdzv = smp::Rendezvous::connect("127.0.0.1", free_port(), 0, 1, std::chrono::seconds(30));
  std::unique_ptr<smp::Communicator> comm = rdzv->new_communicator("dp", "dp", {0}, smp::CommOptions{});
  std::vector<std::thread> threads;
  for (int k = 0; k < 2; ++k)
    threads.emplace_back([&, k] {
      at::Tensor t = at::full({64}, k + 1.0);
      at::Tensor out = at::empty({64});
      for (int i = 0; i < 500; ++i) {
        comm->allreduce(t)->wait();
        comm->broadcast(t, 0)->wait();
        comm->allgather(t, out)->wait();
        if (i % 50 == 0) comm->stats();
      }
    });
  for (auto& t : threads) t.join();
  const smp::CommStats s = comm->stats();
  std::printf("tsan_races: communicator done: %lld allreduce calls\n",
              static_cast<long long>(s.calls.count("allreduce") ? s.calls.at("allreduce") : 0));
  rdzv->shutdown(std::chrono::seconds(5));
}

}  // namespace
}  // namespace tsan_races

int main() try {
  tsan_races::trace_recorder();
  tsan_races::one_communicator_two_threads();
#if TSAN_RACES_CHECKS >= 4
  tsan_races::deferred_weight_grads();
  tsan_races::checkpoint_writer();
#endif
  std::printf("tsan_races: %d checks done\n", TSAN_RACES_CHECKS);
  return 0;
} catch (const std::exception& e) {  // exit, not abort: TSan then reports and sets the exit code
  std::fprintf(stderr, "tsan_races: %s\n", e.what());
  return 3;
}
