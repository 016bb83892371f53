#include "runtime/common/usable_cpus.h"

#include <sched.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace zerod {
namespace internal {

int64_t CpusOfQuota(const std::string& cpu_max) {
  std::istringstream in(cpu_max);
  std::string quota_text, period_text;
  int64_t quota = 0, period = 0;
  if (!(in >> quota_text >> period_text) || !absl::SimpleAtoi(quota_text, &quota) ||
      !absl::SimpleAtoi(period_text, &period) || quota <= 0 || period <= 0) {
    return 0;  // "max": no quota
  }
  return (quota + period - 1) / period;
}

}  // namespace internal

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The smallest quota on the way from this process's cgroup (v2: the "0::" line of
// /proc/self/cgroup) up to the root, in CPUs; 0 for none.
int64_t CgroupQuotaCpus() {
  std::istringstream lines(ReadFile("/proc/self/cgroup"));
  std::string path;
  for (std::string line; std::getline(lines, line);) {
    if (absl::StartsWith(line, "0::")) path = line.substr(3);
  }
  int64_t least = 0;
  while (!path.empty()) {
    const int64_t cpus =
        internal::CpusOfQuota(ReadFile("/sys/fs/cgroup" + (path == "/" ? "" : path) + "/cpu.max"));
    if (cpus > 0 && (least == 0 || cpus < least)) least = cpus;
    if (path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return least;
}

}  // namespace

int64_t UsableCpus() {
  int64_t cpus = 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) cpus = std::max(1, CPU_COUNT(&set));
  const int64_t quota = CgroupQuotaCpus();
  return quota > 0 ? std::min(cpus, quota) : cpus;
}

}  // namespace zerod
