#include "runtime/plan/synthetic_layout.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace zerod::plan {

std::vector<TensorSpec> SyntheticLayout(int64_t params, DType dtype, int64_t tensor_count) {
  const int64_t n = std::max<int64_t>(1, std::min(params, tensor_count));
  std::vector<TensorSpec> tensors;
  tensors.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t numel = params / n + (i < params % n ? 1 : 0);
    tensors.push_back({absl::StrCat("param.", i), {numel}, dtype, ""});
  }
  return tensors;
}

}  // namespace zerod::plan
