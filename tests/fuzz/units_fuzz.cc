// Sizes and counts as users write them (runtime/common/units.h), and the durations zerod's and
// zeroctl's flags take (absl::ParseDuration, then the positive check they apply).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/common/units.h"

namespace {

constexpr int64_t kMaxValue = int64_t{1} << 62;  // units.h: larger values are errors

void CheckParsed(const absl::StatusOr<int64_t>& value) {
  if (!value.ok()) return;
  // The contract callers rely on: positive, and room left for sums.
  if (*value <= 0 || *value > kMaxValue) std::abort();
  (void)zerod::FormatCount(*value);
  (void)zerod::FormatBytes(static_cast<double>(*value));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  CheckParsed(zerod::ParseCount(text));
  CheckParsed(zerod::ParseBytes(text));
  absl::Duration duration;
  if (absl::ParseDuration(std::string(text), &duration) && duration > absl::ZeroDuration()) {
    (void)absl::FormatDuration(duration);
    (void)absl::ToInt64Milliseconds(duration);
  }
  return 0;
}
