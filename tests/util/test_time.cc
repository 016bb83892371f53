#include "tests/util/test_time.h"

#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#ifndef ZEROD_TEST_DEFAULT_TIME_SCALE
#define ZEROD_TEST_DEFAULT_TIME_SCALE 1
#endif

namespace zerod::testing {

double TimeScale() {
  static const double scale = [] {
    double value = ZEROD_TEST_DEFAULT_TIME_SCALE;
    if (const char* env = std::getenv("ZEROD_TEST_TIME_SCALE"); env != nullptr && *env != '\0') {
      double parsed = 0;
      if (absl::SimpleAtod(env, &parsed) && parsed >= 1 && parsed <= 100) value = parsed;
    }
    return value;
  }();
  return scale;
}

absl::Duration Scaled(absl::Duration d) { return d * TimeScale(); }

std::string ScaledFlag(absl::Duration d) { return absl::StrCat(ScaledMs(d), "ms"); }

std::string ScaledMs(absl::Duration d) {
  return absl::StrCat(absl::ToInt64Milliseconds(Scaled(d)));
}

}  // namespace zerod::testing
