// memory.offload's load-ahead plan (core/src/pipeline/offload_prefetch.cpp)
// under every schedule: each slot that recomputes (its whole backward, or its
// input part under zero-bubble schedules) is asked for before that backward
// runs, `horizon` backwards ahead where there are that many.
#include "pipeline/offload_prefetch.h"
#include "schedule/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace smp {
namespace {

bool recomputes(Op op) { return op == Op::Backward || op == Op::BackwardInput; }

TEST(OffloadPrefetch, EveryScheduleLoadsEachBackwardHorizonAhead) {
  for (const std::string& name : schedule_names()) {
    const int chunks = name == "interleaved-1f1b" ? 2 : 1;
    for (int horizon : {0, 1, 2}) {
      const Schedule s = make_schedule(name, 2, 4, chunks);
      for (int rank = 0; rank < s.stages; ++rank) {
        SCOPED_TRACE(name + " rank " + std::to_string(rank) + " horizon " + std::to_string(horizon));
        const std::vector<Action>& actions = s.actions[static_cast<size_t>(rank)];
        const auto plan = offload_prefetches(actions, horizon);
        ASSERT_EQ(plan.size(), actions.size());
        // Where each slot is first asked for, and where its backward runs, by backward count.
        std::map<SlotKey, int> first_asked, runs_at;
        int backward = 0, backwards = 0;
        for (const Action& a : actions) backwards += recomputes(a.op);
        ASSERT_EQ(backwards, 4 * chunks);
        for (size_t i = 0; i < actions.size(); ++i) {
          if (!recomputes(actions[i].op)) {
            EXPECT_TRUE(plan[i].empty()) << "action " << i << " is no backward";
            continue;
          }
          for (const SlotKey& k : plan[i]) first_asked.emplace(k, backward);
          runs_at[{actions[i].microbatch, actions[i].chunk}] = backward;
          ++backward;
        }
        ASSERT_EQ(runs_at.size(), static_cast<size_t>(backwards));
        for (const auto& [slot, at] : runs_at) {
          ASSERT_TRUE(first_asked.count(slot)) << "microbatch " << slot.first << " chunk " << slot.second
                                               << " is never loaded ahead";
          EXPECT_EQ(first_asked[slot], std::max(0, at - horizon))
              << "microbatch " << slot.first << " chunk " << slot.second;
        }
      }
    }
  }
}

}  // namespace
}  // namespace smp
