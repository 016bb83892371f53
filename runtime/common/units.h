#ifndef ZEROD_RUNTIME_COMMON_UNITS_H_
#define ZEROD_RUNTIME_COMMON_UNITS_H_

// Parsing and printing of counts ("7.5B") and byte sizes ("80GiB") as users write them.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zerod {

// A positive whole count: "1000", "7.5e9", "7.5B", "128B", "1T", "350M", "4K" (K=1e3, M=1e6,
// B or G=1e9, T=1e12; case-insensitive). Fractions that do not land on a whole number, zero,
// negatives and values above 2^62 are errors that quote the text.
absl::StatusOr<int64_t> ParseCount(absl::string_view text);

// A positive byte size: "80GiB", "512MiB", "1.5TiB" (powers of 1024), "80GB", "80G", "500MB"
// (powers of 1000), "4096" (bytes). Same error rules as ParseCount.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);

// Decimal gigabytes as the ZeRO paper prints them: "31.41 GB", "1.88 GB", "512.0 MB".
std::string FormatBytes(double bytes);

// A parameter count the way papers print it: "7.50B", "128.00B", "1.00T", "350.00M", "4096".
std::string FormatCount(int64_t count);

}  // namespace zerod

#endif  // ZEROD_RUNTIME_COMMON_UNITS_H_
