#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/abortable_store.h"
#include "runtime/comm/file_store.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/comm/prefix_store.h"

namespace zerod::comm {
namespace {

using ::testing::HasSubstr;

TEST(InMemoryStore, SetGetAddCompareSetDelete) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  EXPECT_EQ(*store.Get("a", absl::ZeroDuration()), "1");
  EXPECT_EQ(*store.Add("n", 5), 5);
  EXPECT_EQ(*store.Add("n", -2), 3);
  EXPECT_EQ(*store.Get("n", absl::ZeroDuration()), "3");
  EXPECT_EQ(store.Add("a", 1).status().code(), absl::StatusCode::kOk);  // "1" is an integer
  ASSERT_TRUE(store.Set("s", "text").ok());
  EXPECT_EQ(store.Add("s", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*store.CompareSet("c", std::nullopt, "x"), "x");  // absent -> swapped
  EXPECT_EQ(*store.CompareSet("c", std::nullopt, "y"), "x");  // present -> not swapped
  EXPECT_EQ(*store.CompareSet("c", "x", "z"), "z");
  EXPECT_EQ(*store.CompareSet("c", "wrong", "w"), "z");
  EXPECT_TRUE(*store.Delete("c"));
  EXPECT_FALSE(*store.Delete("c"));
}

TEST(InMemoryStore, GetBlocksUntilSetOrTimeout) {
  InMemoryStore store;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_TRUE(store.Set("late", "v").ok());
  });
  EXPECT_EQ(*store.Get("late", absl::Seconds(10)), "v");
  setter.join();
  auto missing = store.Get("never", absl::Milliseconds(20));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'never'"));
}

TEST(InMemoryStore, WaitNamesTheMissingKeys) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("k1", "").ok());
  EXPECT_TRUE(store.Wait({"k1"}, absl::Milliseconds(10)).ok());
  absl::Status s = store.Wait({"k1", "k2"}, absl::Milliseconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("k2"));
}

// A FileStore in a fresh directory under the test's temporary folder.
std::string FreshDirectory() {
  std::string pattern = ::testing::TempDir() + "file_store_XXXXXX";
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern;
}

TEST(FileStore, SetGetAddCompareSetDelete) {
  FileStore store(FreshDirectory());
  ASSERT_TRUE(store.Set("a/b", std::string("1\0x", 3)).ok());  // any bytes, any key
  EXPECT_EQ(*store.Get("a/b", absl::ZeroDuration()), std::string("1\0x", 3));
  EXPECT_EQ(*store.Add("n", 5), 5);
  EXPECT_EQ(*store.Add("n", -2), 3);
  EXPECT_EQ(*store.Get("n", absl::ZeroDuration()), "3");
  ASSERT_TRUE(store.Set("s", "text").ok());
  EXPECT_EQ(store.Add("s", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*store.CompareSet("c", std::nullopt, "x"), "x");
  EXPECT_EQ(*store.CompareSet("c", std::nullopt, "y"), "x");
  EXPECT_EQ(*store.CompareSet("c", "x", "z"), "z");
  EXPECT_EQ(*store.CompareSet("c", "wrong", "w"), "z");
  EXPECT_TRUE(*store.Delete("c"));
  EXPECT_FALSE(*store.Delete("c"));
  auto missing = store.Get("never", absl::Milliseconds(20));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'never'"));
  absl::Status s = store.Wait({"n", "k2"}, absl::Milliseconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("k2"));
}

TEST(FileStore, ProcessesShareItAndTheirAddsAreAtomic) {
  const std::string dir = FreshDirectory();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FileStore theirs(dir);
    for (int i = 0; i < 200; ++i) {
      if (!theirs.Add("count", 1).ok()) _exit(1);
    }
    _exit(theirs.Set("child done", "yes").ok() ? 0 : 1);
  }
  FileStore mine(dir);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(mine.Add("count", 1).ok());
  EXPECT_EQ(*mine.Get("child done", absl::Seconds(60)), "yes");
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(*mine.Get("count", absl::ZeroDuration()), "400");
}

TEST(PrefixStore, NamespacesKeys) {
  auto inner = std::make_shared<InMemoryStore>();
  PrefixStore a("gen1", inner), b("gen2", inner);
  ASSERT_TRUE(a.Set("id", "A").ok());
  ASSERT_TRUE(b.Set("id", "B").ok());
  EXPECT_EQ(*a.Get("id", absl::ZeroDuration()), "A");
  EXPECT_EQ(*inner->Get("gen2/id", absl::ZeroDuration()), "B");
  EXPECT_EQ(*a.Add("n", 2), 2);
  EXPECT_TRUE(a.Wait({"id", "n"}, absl::Milliseconds(10)).ok());
  EXPECT_FALSE(b.Wait({"n"}, absl::Milliseconds(10)).ok());
}

// A rank declared lost may wait on keys its gone peers would have written: the abort ends it.
TEST(AbortableStore, AnAbortEndsAWaitInProgressWithItsReason) {
  auto inner = std::make_shared<InMemoryStore>();
  AbortableStore store(inner, absl::Milliseconds(20));
  ASSERT_TRUE(store.Set("here", "1").ok());
  EXPECT_EQ(*store.Get("here", absl::Seconds(1)), "1");
  EXPECT_EQ(store.Get("never", absl::Milliseconds(50)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    store.Abort(absl::AbortedError("job j: rank 1 was lost"));
  });
  const absl::Time start = absl::Now();
  const absl::StatusOr<std::string> got = store.Get("never", absl::Seconds(60));
  aborter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("rank 1 was lost"));
  EXPECT_EQ(store.Wait({"here"}, absl::Seconds(1)).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(store.Set("later", "2").ok()) << "writes still go through";
}

}  // namespace
}  // namespace zerod::comm
