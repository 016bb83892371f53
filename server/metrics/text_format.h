#ifndef ZEROD_SERVER_METRICS_TEXT_FORMAT_H_
#define ZEROD_SERVER_METRICS_TEXT_FORMAT_H_

// The Prometheus text exposition format, version 0.0.4: what /metrics answers.
//
// TextWriter appends families in the order it is given them; a caller writes one family's # HELP
// and # TYPE (Header) and then all of its samples before the next family, as the format requires.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zerod::metrics {

// The Content-Type of the format.
inline constexpr char kTextContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// Label name -> value, in the order they are written.
using Labels = std::vector<std::pair<std::string, std::string>>;

// [a-zA-Z_:][a-zA-Z0-9_:]*
bool IsValidMetricName(std::string_view name);
// [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__" (reserved).
bool IsValidLabelName(std::string_view name);

// HELP text: backslash and newline escaped.
std::string EscapeHelp(std::string_view help);
// A label value: backslash, double quote and newline escaped.
std::string EscapeLabelValue(std::string_view value);
// A sample value: integers without exponent or fraction, "+Inf", "-Inf", "NaN".
std::string FormatValue(double value);

class TextWriter {
 public:
  // type: "counter", "gauge", "histogram" (or "untyped").
  void Header(std::string_view name, std::string_view help, std::string_view type);
  void Sample(std::string_view name, const Labels& labels, double value);
  const std::string& text() const { return text_; }
  std::string Take() { return std::move(text_); }

 private:
  std::string text_;
};

}  // namespace zerod::metrics

#endif  // ZEROD_SERVER_METRICS_TEXT_FORMAT_H_
