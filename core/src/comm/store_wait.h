// The one wait for a store counter: the parties of a barrier each arrive
// once, and a waiter returns when all have, or fails as every wait in comm/
// does (WaitFailed, comm/wait.h), naming the parties that had not arrived.
// Used by the shared-memory setup (every member mapped a segment), the
// rendezvous' shutdown barrier and the checkpoint commit (every rank's part
// is on disk).
//
// The count is polled (1 ms, then every 10 ms after the first 100 ms): a
// blocking store wait with a deadline of its own would leave, when it times
// out, a reply in flight on the store's connection that the next request
// would read as its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace smp {

namespace c10d_compat {
class Store;
}

// Party `party` (0 <= party < parties) arrives at the barrier `key`: marks
// itself (<key>/<party>, for the failure's list of the missing) and counts.
void arrive(c10d_compat::Store& store, const std::string& key, int party);

// Returns once `parties` parties have arrived at `key`. After `timeout`,
// throws WaitFailed: "timed out after <ms> ms waiting for <what>; missing:
// <label>s <the parties with no mark>". Store failures (c10d_compat::Failure)
// pass through.
void wait_for_arrivals(c10d_compat::Store& store, const std::string& key, int parties,
                       std::chrono::milliseconds timeout, const std::string& what, const std::string& label);

}  // namespace smp
