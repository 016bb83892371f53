#include "runtime/common/usable_cpus.h"

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

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

TEST(UsableCpus, AQuotaCountsItsWholeCpus) {
  EXPECT_EQ(internal::CpusOfQuota("max 100000\n"), 0);
  EXPECT_EQ(internal::CpusOfQuota("200000 100000\n"), 2);
  EXPECT_EQ(internal::CpusOfQuota("150000 100000\n"), 1);
  EXPECT_EQ(internal::CpusOfQuota("50000 100000"), 1);
  EXPECT_EQ(internal::CpusOfQuota(""), 0);
  EXPECT_EQ(internal::CpusOfQuota("garbage"), 0);
  EXPECT_EQ(internal::CpusOfQuota("-1 100000"), 0);
}

// A cgroup tree in a temporary directory: the tightest quota on the way up to the root counts,
// wherever it is set; a v1-only /proc/self/cgroup names no quota.
TEST(UsableCpus, TheTightestQuotaFromTheCgroupUpToTheRootCounts) {
  const std::filesystem::path root =
      std::filesystem::temp_directory_path() / ("zerod-cgroup-" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root / "kubepods" / "pod1" / "ctr");
  const auto write = [&](const std::filesystem::path& dir, const std::string& text) {
    std::ofstream(dir / "cpu.max") << text;
  };
  const std::string in_ctr = "0::/kubepods/pod1/ctr\n";
  EXPECT_EQ(internal::CgroupQuotaCpus(root.string(), in_ctr), 0);  // no cpu.max anywhere
  write(root, "max 100000\n");
  write(root / "kubepods" / "pod1" / "ctr", "max 100000\n");
  EXPECT_EQ(internal::CgroupQuotaCpus(root.string(), in_ctr), 0);
  write(root / "kubepods", "800000 100000\n");
  EXPECT_EQ(internal::CgroupQuotaCpus(root.string(), in_ctr), 8);
  write(root / "kubepods" / "pod1", "300000 100000\n");
  EXPECT_EQ(internal::CgroupQuotaCpus(root.string(), in_ctr), 3);
  write(root / "kubepods" / "pod1" / "ctr", "200000 100000\n");
  EXPECT_EQ(internal::CgroupQuotaCpus(root.string(), in_ctr), 2);
  EXPECT_EQ(internal::CgroupQuotaCpus(root.string(), "0::/kubepods\n"), 8);
  write(root, "100000 100000\n");
  EXPECT_EQ(internal::CgroupQuotaCpus(root.string(), "0::/\n"), 1);
  EXPECT_EQ(internal::CgroupQuotaCpus(root.string(), "4:memory:/kubepods/pod1\n1:cpu:/\n"), 0);
  EXPECT_EQ(internal::CgroupQuotaCpus(root.string(), ""), 0);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace zerod
