// TimerQueue on a FakeClock: callbacks run when the clock reaches their deadline, in deadline
// order, and Advance() returns only after they ran, so nothing here sleeps.

#include "server/timer_queue.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/common/mutex.h"
#include "server/clock.h"

namespace zerod::server {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Records which timers ran, from the queue's thread.
class Ran {
 public:
  std::function<void()> Mark(int id) {
    return [this, id] {
      MutexLock lock(&mu_);
      ids_.push_back(id);
    };
  }
  std::vector<int> ids() {
    MutexLock lock(&mu_);
    return ids_;
  }
  // Waits for callbacks that run without a jump; the bound only turns a failure into a message.
  bool AwaitCount(size_t n) {
    MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout([this, n]()
                                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ids_.size() >= n; },
                                absl::Seconds(30));
  }

 private:
  Mutex mu_;
  std::vector<int> ids_ ABSL_GUARDED_BY(mu_);
};

TEST(TimerQueue, RunsCallbacksWhenTheClockReachesTheirDeadlineInOrder) {
  FakeClock clock;
  Ran ran;
  TimerQueue timers(&clock);
  const absl::Time t0 = clock.Now();
  timers.Schedule(t0 + absl::Seconds(3), ran.Mark(3));
  timers.Schedule(t0 + absl::Seconds(1), ran.Mark(1));
  timers.Schedule(t0 + absl::Seconds(2), ran.Mark(2));
  clock.Advance(absl::Milliseconds(999));
  EXPECT_THAT(ran.ids(), IsEmpty());
  clock.Advance(absl::Milliseconds(1));
  EXPECT_THAT(ran.ids(), ElementsAre(1));
  clock.Advance(absl::Seconds(5));
  EXPECT_THAT(ran.ids(), ElementsAre(1, 2, 3));
}

TEST(TimerQueue, ADeadlineAlreadyPassedRunsWithoutAJump) {
  FakeClock clock;
  Ran ran;
  TimerQueue timers(&clock);
  timers.Schedule(clock.Now() - absl::Seconds(1), ran.Mark(7));
  ASSERT_TRUE(ran.AwaitCount(1));
  EXPECT_THAT(ran.ids(), ElementsAre(7));
}

TEST(TimerQueue, ACallbackMayScheduleAnother) {
  FakeClock clock;
  Ran ran;
  TimerQueue timers(&clock);
  const absl::Time t0 = clock.Now();
  timers.Schedule(t0 + absl::Seconds(1), [&] {
    ran.Mark(1)();
    timers.Schedule(t0 + absl::Seconds(2), ran.Mark(2));
  });
  clock.Advance(absl::Seconds(1));
  EXPECT_THAT(ran.ids(), ElementsAre(1));
  clock.Advance(absl::Seconds(1));
  EXPECT_THAT(ran.ids(), ElementsAre(1, 2));
}

TEST(TimerQueue, EveryQueueOnAClockSeesItsJumps) {
  FakeClock clock;
  Ran ran;
  TimerQueue first(&clock);
  TimerQueue second(&clock);
  first.Schedule(clock.Now() + absl::Seconds(1), ran.Mark(1));
  second.Schedule(clock.Now() + absl::Seconds(1), ran.Mark(2));
  clock.Advance(absl::Seconds(1));
  EXPECT_THAT(ran.ids(), ::testing::UnorderedElementsAre(1, 2));
}

TEST(TimerQueue, DestructionDropsWhatHasNotRunAndStopsObservingTheClock) {
  FakeClock clock;
  Ran ran;
  {
    TimerQueue timers(&clock);
    timers.Schedule(clock.Now() + absl::Seconds(1), ran.Mark(1));
  }
  clock.Advance(absl::Seconds(2));  // would reach a destroyed queue if it still observed
  EXPECT_THAT(ran.ids(), IsEmpty());
}

TEST(TimerQueue, RealClockDeadlinesPassByThemselves) {
  RealClock clock;
  Ran ran;
  TimerQueue timers(&clock);
  timers.Schedule(clock.Now() + absl::Milliseconds(1), ran.Mark(1));
  ASSERT_TRUE(ran.AwaitCount(1));
  EXPECT_THAT(ran.ids(), ElementsAre(1));
}

}  // namespace
}  // namespace zerod::server
