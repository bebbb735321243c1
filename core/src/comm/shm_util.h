// What the shared-memory transports (shm_collectives, shm_mailbox) share:
// whether two processes can share memory, segments, and how long a waiter
// polls (the wait itself is comm/wait.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace smp::shm {

constexpr int64_t kLine = 64;
constexpr int64_t kPage = 4096;

inline int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// Same boot, same pid namespace, same /dev/shm: segment names and pids mean
// the same thing to every process that reports the same string. Empty when
// unknown (then nothing is shared).
std::string host_identity();

// How often to poll before sleeping on a futex (~10-100 us of polling): only
// when every rank of the host (group_size, or LOCAL_WORLD_SIZE if larger) has
// a core of its own; with more ranks than cores a spinning rank takes the core
// from the rank it waits for. 0 = sleep at once.
int spins_for_this_host(int group_size);

// A new, empty /dev/shm segment of `bytes`, space reserved (posix_fallocate,
// so a full /dev/shm is an error here, not a SIGBUS later), named
// /smp-<pid>-<stem><n> with n from a process-wide counter. A name a killed
// process left behind (its pid come round again) is skipped, not an error.
// On failure fd < 0, nothing is left behind, and `error` says why and what to
// do (`what_for` names the use, e.g. " for the messages to group rank 1").
struct NewSegment {
  int fd = -1;
  std::string name, error;
};
NewSegment create_segment(const std::string& stem, size_t bytes, const std::string& what_for = "");

// A read-write shared mapping of a segment, or base null and `error` saying why.
struct Mapped {
  char* base = nullptr;
  size_t bytes = 0;
  std::string error;
};
// Maps `bytes` of the open segment `fd` (0: its whole size) and closes fd
// either way; `name` is for the error.
Mapped map_and_close(int fd, size_t bytes, const std::string& name);
// Opens and maps the segment group rank `creator` published (through the
// store) as `published`: its name, or "!" and why it could not make it.
// `what` names the segment in errors ("its shared buffer").
Mapped open_published(const std::string& published, size_t bytes, int creator, const std::string& what);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Shared between processes: only lock-free (address-free) atomics and plain data.
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free);

}  // namespace smp::shm
