// Point-to-point messages through shared memory between the members of a group
// that all run on one host: what pipeline stages send each other (activations,
// their gradients) without Gloo's loopback sockets (a send there costs its
// caller the write into the socket; here it is one memcpy; the measurement is
// in docs/benchmarks.md).
//
// Each rank, on its first send to a peer, creates an outbox for that peer: a
// shared segment with a ring of message descriptors and a data arena. send()
// copies the tensor into the arena, fills a descriptor (tag, bytes, offset) and
// returns done: the caller's tensor is free at once, as with a buffered send.
// recv() takes, on wait(), the oldest posted descriptor with its tag (tags may
// be received out of order), copies the bytes out and marks the descriptor
// taken; the sender reuses descriptors and arena space once taken.
//
// A message that does not fit into the arena's free space goes through the
// c10d backend instead, announced by its descriptor, so a receiver never
// waits on data that is queued behind messages it will only take later.
//
// The receiver maps the outbox by the name the sender publishes in the store
// and unlinks it; the sender unlinks it too when it goes (whichever is first),
// so nothing stays in /dev/shm after a normal exit. A waiting receiver notices
// a sender that exited (kill(pid, 0)) within ~100 ms, and a sender waiting for
// a free descriptor a receiver that did (comm/wait.h).
#pragma once

#include "comm/c10d_compat.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace smp {

class ShmMailbox {
 public:
  // For a group whose members all run on this host (the caller knows:
  // ShmCollectives::create found so). Not collective, and nothing is mapped
  // yet: an outbox is made on the first send to its peer, with arena_bytes of
  // data space (/dev/shm).
  static std::unique_ptr<ShmMailbox> create(std::shared_ptr<c10d_compat::Store> store, const std::string& key_prefix,
                                            int rank, int size, int64_t arena_bytes, std::chrono::milliseconds timeout);
  ~ShmMailbox();

  // Tensors: dense, contiguous, CPU. send() has copied `t` when it returns
  // (the work is done, or, for a message that went through `backend`, that
  // backend's pending send; send() throws WaitFailed when kDescriptors
  // earlier messages stay untaken until the timeout). recv() fills `t` in
  // wait(), which throws c10d_compat::Failure on a size mismatch, WaitFailed
  // (comm/wait.h) on a sender that exited or the timeout.
  // *through_backend (when given) says whether the message went through `backend`.
  std::shared_ptr<c10d_compat::PendingWork> send(const at::Tensor& t, int peer, int tag, c10d_compat::Backend& backend,
                                                 bool* through_backend = nullptr);
  std::shared_ptr<c10d_compat::PendingWork> recv(const at::Tensor& t, int peer, int tag, c10d_compat::Backend& backend);

  // Bytes copied into outboxes so far (messages sent through `backend` are
  // that backend's to count).
  int64_t bytes_written() const;

  struct Impl;

 private:
  explicit ShmMailbox(std::unique_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace smp
