#ifndef ZEROD_CLIENT_LAYOUT_JSON_H_
#define ZEROD_CLIENT_LAYOUT_JSON_H_

// The layout file format (docs/cli.md, "Layout files"): a JSON object
//   {"tensors": [{"name": "wte", "shape": [50304, 768], "dtype": "bf16", "unit": "embed"}, ...]}
// or the bare list. "dtype" defaults to the caller's; "unit" (optional) names the stage-3 gather
// unit. Errors name the position: "tensors[3].shape[1]: expected a non-negative integer".

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/common/dtype.h"
#include "runtime/plan/plan_input.h"

namespace zerod::client {

absl::StatusOr<std::vector<plan::TensorSpec>> ParseLayoutJson(absl::string_view text,
                                                              DType default_dtype);

// Reads and parses a layout file; errors start with the path.
absl::StatusOr<std::vector<plan::TensorSpec>> ReadLayoutFile(const std::string& path,
                                                             DType default_dtype);

}  // namespace zerod::client

#endif  // ZEROD_CLIENT_LAYOUT_JSON_H_
