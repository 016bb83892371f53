#include "runtime/common/mutex.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace zerod {
namespace {

TEST(Mutex, AwaitWakesWhenAnotherThreadChangesTheStateAndUnlocks) {
  Mutex mu;
  int value = 0;  // guarded by mu
  std::thread writer([&] {
    for (int i = 0; i < 5; ++i) {
      MutexLock lock(&mu);
      ++value;
    }
  });
  {
    MutexLock lock(&mu);
    mu.Await([&] { return value == 5; });
    EXPECT_EQ(value, 5);
  }
  writer.join();
}

TEST(Mutex, AwaitWithTimeoutGivesUpAndReportsTheCondition) {
  Mutex mu;
  MutexLock lock(&mu);
  EXPECT_FALSE(mu.AwaitWithTimeout([] { return false; }, absl::Milliseconds(20)));
  EXPECT_TRUE(mu.AwaitWithTimeout([] { return true; }, absl::ZeroDuration()));
  EXPECT_FALSE(mu.AwaitWithDeadline([] { return false; }, absl::InfinitePast()));
}

TEST(Mutex, ManyWaitersEachSeeTheirOwnCondition) {
  Mutex mu;
  int stage = 0;  // guarded by mu
  std::vector<std::thread> waiters;
  std::vector<int> seen(4, -1);
  for (int w = 0; w < 4; ++w) {
    waiters.emplace_back([&, w] {
      MutexLock lock(&mu);
      mu.Await([&] { return stage > w; });
      seen[w] = stage;
    });
  }
  for (int s = 1; s <= 4; ++s) {
    MutexLock lock(&mu);
    stage = s;
  }
  for (std::thread& t : waiters) t.join();
  for (int w = 0; w < 4; ++w) EXPECT_GT(seen[w], w);
}

// A waiter that changed the state before waiting must wake the others, though waiting releases
// the mutex without Unlock().
TEST(Mutex, EnteringAwaitWakesWaitersForTheStateItChanged) {
  Mutex mu;
  bool waiting = false, asked = false, answered = false;  // guarded by mu
  std::thread answerer([&] {
    MutexLock lock(&mu);
    waiting = true;
    mu.Await([&] { return asked; });
    answered = true;
  });
  {
    MutexLock lock(&mu);
    // Once this thread holds mu and sees `waiting`, the answerer is asleep inside Await.
    EXPECT_TRUE(mu.AwaitWithTimeout([&] { return waiting; }, absl::Seconds(20)));
    asked = true;
    EXPECT_TRUE(mu.AwaitWithTimeout([&] { return answered; }, absl::Seconds(20)));
  }
  answerer.join();
}

TEST(Mutex, AWaiterThatChangedStateBeforeWaitingWakesTheOthers) {
  // Two threads each arrive and wait for both to have arrived: the second to arrive changes the
  // count and then waits itself, releasing the mutex without an Unlock.
  Mutex mu;
  int arrived = 0;  // guarded by mu
  auto arrive = [&] {
    MutexLock lock(&mu);
    ++arrived;
    EXPECT_TRUE(mu.AwaitWithTimeout([&] { return arrived == 2; }, absl::Seconds(30)));
  };
  std::thread first(arrive), second(arrive);
  first.join();
  second.join();
}

TEST(Notification, WaitsReturnOnceNotified) {
  Notification n;
  EXPECT_FALSE(n.HasBeenNotified());
  EXPECT_FALSE(n.WaitForNotificationWithTimeout(absl::Milliseconds(10)));
  std::thread notifier([&] { n.Notify(); });
  n.WaitForNotification();
  notifier.join();
  EXPECT_TRUE(n.HasBeenNotified());
  EXPECT_TRUE(n.WaitForNotificationWithTimeout(absl::ZeroDuration()));
}

}  // namespace
}  // namespace zerod
