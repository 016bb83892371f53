#ifndef ZEROD_TESTS_RUNTIME_COMMON_PINNED_TO_ONE_CPU_H_
#define ZEROD_TESTS_RUNTIME_COMMON_PINNED_TO_ONE_CPU_H_

// Pins the calling thread to the first CPU of its mask while in scope (as `taskset -c` would); the
// threads it creates meanwhile inherit the pin. Restores the mask it found.

#include <pthread.h>
#include <sched.h>

#include "gtest/gtest.h"

namespace zerod {

class PinnedToOneCpu {
 public:
  PinnedToOneCpu() {
    EXPECT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(was_), &was_), 0);
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &was_)) {
        CPU_SET(cpu, &one);
        break;
      }
    }
    EXPECT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
  }
  ~PinnedToOneCpu() { EXPECT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(was_), &was_), 0); }
  PinnedToOneCpu(const PinnedToOneCpu&) = delete;
  PinnedToOneCpu& operator=(const PinnedToOneCpu&) = delete;

 private:
  cpu_set_t was_;
};

}  // namespace zerod

#endif  // ZEROD_TESTS_RUNTIME_COMMON_PINNED_TO_ONE_CPU_H_
