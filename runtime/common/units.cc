#include "runtime/common/units.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace zerod {
namespace {

constexpr double kMaxValue = 4611686018427387904.0;  // 2^62: room for sums without overflow.

struct Suffix {
  absl::string_view text;
  double scale;
};

// Splits "7.5GiB" into the number 7.5 and the suffix "gib" (lower-cased); the number must use the
// whole numeric prefix.
absl::StatusOr<int64_t> ParseScaled(absl::string_view text, const Suffix* suffixes, size_t n,
                                    absl::string_view what) {
  const std::string trimmed(absl::StripAsciiWhitespace(text));
  if (trimmed.empty()) return absl::InvalidArgumentError(absl::StrCat("empty ", what));
  if (trimmed.find_first_of("xXpP") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("cannot parse ", what, " '", text, "'"));
  }
  const char* begin = trimmed.c_str();
  char* end = nullptr;
  errno = 0;
  const double number = std::strtod(begin, &end);
  if (end == begin || errno == ERANGE || !std::isfinite(number)) {
    return absl::InvalidArgumentError(absl::StrCat("cannot parse ", what, " '", text, "'"));
  }
  // strtod accepts hex and "inf"; insist on a plain decimal start.
  if (!(std::isdigit(static_cast<unsigned char>(begin[0])) || begin[0] == '.' || begin[0] == '-' ||
        begin[0] == '+')) {
    return absl::InvalidArgumentError(absl::StrCat("cannot parse ", what, " '", text, "'"));
  }
  const std::string suffix = absl::AsciiStrToLower(absl::StripAsciiWhitespace(end));
  double scale = 0;
  for (size_t i = 0; i < n; ++i) {
    if (suffixes[i].text == suffix) scale = suffixes[i].scale;
  }
  if (scale == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse ", what, " '", text, "': unknown unit '", suffix, "'"));
  }
  const double value = number * scale;
  if (value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be positive, got '", text, "'"));
  }
  if (value > kMaxValue) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "' is too large"));
  }
  if (value != std::floor(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "' is not a whole number (", value, ")"));
  }
  return static_cast<int64_t>(value);
}

}  // namespace

absl::StatusOr<int64_t> ParseCount(absl::string_view text) {
  static constexpr Suffix kSuffixes[] = {{"", 1},    {"k", 1e3}, {"m", 1e6},
                                         {"b", 1e9}, {"g", 1e9}, {"t", 1e12}};
  return ParseScaled(text, kSuffixes, std::size(kSuffixes), "count");
}

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  static constexpr Suffix kSuffixes[] = {{"", 1},
                                         {"b", 1},
                                         {"k", 1e3},
                                         {"kb", 1e3},
                                         {"m", 1e6},
                                         {"mb", 1e6},
                                         {"g", 1e9},
                                         {"gb", 1e9},
                                         {"t", 1e12},
                                         {"tb", 1e12},
                                         {"kib", 1024.0},
                                         {"mib", 1048576.0},
                                         {"gib", 1073741824.0},
                                         {"tib", 1099511627776.0}};
  return ParseScaled(text, kSuffixes, std::size(kSuffixes), "byte size");
}

std::string FormatBytes(double bytes) {
  const double abs = std::fabs(bytes);
  if (abs >= 1e12) return absl::StrFormat("%.2f TB", bytes / 1e12);
  if (abs >= 1e9) return absl::StrFormat("%.2f GB", bytes / 1e9);
  if (abs >= 1e6) return absl::StrFormat("%.2f MB", bytes / 1e6);
  if (abs >= 1e3) return absl::StrFormat("%.2f KB", bytes / 1e3);
  return absl::StrFormat("%.0f B", bytes);
}

std::string FormatCount(int64_t count) {
  const double c = static_cast<double>(count);
  if (count >= 1000000000000) return absl::StrFormat("%.2fT", c / 1e12);
  if (count >= 1000000000) return absl::StrFormat("%.2fB", c / 1e9);
  if (count >= 1000000) return absl::StrFormat("%.2fM", c / 1e6);
  return absl::StrCat(count);
}

}  // namespace zerod
