#ifndef ZEROD_TESTS_UTIL_TEST_TIME_H_
#define ZEROD_TESTS_UTIL_TEST_TIME_H_

// Real-time durations in tests (leases, grace periods, timeouts given to real processes) scale
// with how slowly this build runs: 1 in an optimized build, more under a sanitizer, whose
// processes run several times slower, and more again where ZEROD_TEST_TIME_SCALE says the
// machine is loaded. A test that waits on real time states a duration as it would on an idle
// optimized build and passes it through Scaled(); one that can use a fake clock
// (server/clock.h) should.

#include <string>

#include "absl/time/time.h"

namespace zerod::testing {

// The factor: $ZEROD_TEST_TIME_SCALE when set (a number >= 1), else the build's default
// (cmake: 1, ASan 3, TSan 6).
double TimeScale();

// `d` times TimeScale().
absl::Duration Scaled(absl::Duration d);

// Scaled(d) as a flag value zerod, zerorun and the SDK parse ("3s", "1500ms").
std::string ScaledFlag(absl::Duration d);

// Scaled(d) as a whole number of milliseconds ("1500"), for flags that take one
// (tests/integration/join_client's --run-ms).
std::string ScaledMs(absl::Duration d);

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_UTIL_TEST_TIME_H_
