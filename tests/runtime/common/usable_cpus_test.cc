#include "runtime/common/usable_cpus.h"

#include <sched.h>

#include "gtest/gtest.h"
#include "tests/runtime/common/pinned_to_one_cpu.h"

namespace zerod {
namespace {

TEST(UsableCpus, CountsTheAffinityMaskAtMost) {
  cpu_set_t mask;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(mask), &mask), 0);
  EXPECT_GE(UsableCpus(), 1);
  EXPECT_LE(UsableCpus(), CPU_COUNT(&mask));
}

// A thread pinned to one CPU (taskset -c 0) may use one, whatever the machine has.
TEST(UsableCpus, AThreadPinnedToOneCpuHasOne) {
  PinnedToOneCpu pinned;
  EXPECT_EQ(UsableCpus(), 1);
}

TEST(UsableCpus, AQuotaCountsItsCpusRoundedUp) {
  EXPECT_EQ(internal::CpusOfQuota("max 100000\n"), 0);
  EXPECT_EQ(internal::CpusOfQuota("200000 100000\n"), 2);
  EXPECT_EQ(internal::CpusOfQuota("150000 100000\n"), 2);
  EXPECT_EQ(internal::CpusOfQuota("50000 100000"), 1);
  EXPECT_EQ(internal::CpusOfQuota(""), 0);
  EXPECT_EQ(internal::CpusOfQuota("garbage"), 0);
  EXPECT_EQ(internal::CpusOfQuota("-1 100000"), 0);
}

}  // namespace
}  // namespace zerod
