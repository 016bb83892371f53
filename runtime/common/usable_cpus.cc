#include "runtime/common/usable_cpus.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace zerod {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The CPUs of the calling thread's affinity mask, in a set as large as the kernel's (a fixed
// cpu_set_t holds 1,024 CPUs, and sched_getaffinity refuses a set smaller than the kernel's).
int64_t AffinityCpus() {
  for (int cpus = 1024; cpus <= (1 << 20); cpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) return 1;
    const size_t bytes = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(bytes, set);
    const int rc = ::sched_getaffinity(0, bytes, set);
    const int error = errno;
    const int count = CPU_COUNT_S(bytes, set);
    CPU_FREE(set);
    if (rc == 0) return std::max(1, count);
    if (error != EINVAL) return 1;
  }
  return 1;
}

}  // namespace

namespace internal {

int64_t CpusOfQuota(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota_text, period_text;
  int64_t quota = 0, period = 0;
  if (!(in >> quota_text >> period_text) || !absl::SimpleAtoi(quota_text, &quota) ||
      !absl::SimpleAtoi(period_text, &period) || quota <= 0 || period <= 0) {
    return 0;  // "max": no quota
  }
  // Rounded down: a quota of 1.5 CPUs leaves a rank that fills one no whole CPU to spare.
  return std::max<int64_t>(1, quota / period);
}

int64_t CgroupQuotaCpus(const std::string& cgroup_root, const std::string& proc_self_cgroup) {
  std::istringstream lines(proc_self_cgroup);
  std::string path;
  for (std::string line; std::getline(lines, line);) {
    if (absl::StartsWith(line, "0::/")) path = line.substr(3);
  }
  int64_t least = 0;
  while (!path.empty()) {
    const int64_t cpus =
        CpusOfQuota(ReadFile(cgroup_root + (path == "/" ? "" : path) + "/cpu.max"));
    if (cpus > 0 && (least == 0 || cpus < least)) least = cpus;
    if (path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return least;
}

}  // namespace internal

int64_t UsableCpus() {
  const int64_t cpus = AffinityCpus();
  const int64_t quota = internal::CgroupQuotaCpus("/sys/fs/cgroup", ReadFile("/proc/self/cgroup"));
  return quota > 0 ? std::min(cpus, quota) : cpus;
}

}  // namespace zerod
