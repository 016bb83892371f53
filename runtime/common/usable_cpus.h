#ifndef ZEROD_RUNTIME_COMMON_USABLE_CPUS_H_
#define ZEROD_RUNTIME_COMMON_USABLE_CPUS_H_

// How many CPUs the calling thread may run on at once: the CPUs of its affinity mask (taskset,
// a cpuset), fewer where a cgroup v2 CPU quota (cpu.max, a container's CPU limit) on its cgroup
// or an ancestor allows less time per period. At least 1. (A cgroup v1 quota is not read.)

#include <cstdint>
#include <string>

namespace zerod {

int64_t UsableCpus();

namespace internal {
// The quota of one cpu.max file's text ("max 100000", "150000 100000") in whole CPUs, at least 1;
// 0 for none or for text that is not a quota.
int64_t CpusOfQuota(const std::string& cpu_max);
// The smallest quota in whole CPUs on the way from the cgroup that `proc_self_cgroup` (the text of
// /proc/self/cgroup) names on its v2 line ("0::/path") up to the root, reading the cpu.max files
// under `cgroup_root` (/sys/fs/cgroup); 0 for none.
int64_t CgroupQuotaCpus(const std::string& cgroup_root, const std::string& proc_self_cgroup);
}  // namespace internal

}  // namespace zerod

#endif  // ZEROD_RUNTIME_COMMON_USABLE_CPUS_H_
