#ifndef ZEROD_RUNTIME_COMMON_DTYPE_H_
#define ZEROD_RUNTIME_COMMON_DTYPE_H_

// Element types of parameters and gradients, and their sizes.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace zerod {

enum class DType : uint8_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Bytes per element: 4 for fp32, 2 for bf16 and fp16.
constexpr int64_t DTypeBytes(DType t) { return t == DType::kFloat32 ? 4 : 2; }

// "fp32", "bf16", "fp16": the spelling used by the CLI, the layout file and the wire.
absl::string_view DTypeName(DType t);

// Accepts fp32/float32/float, bf16/bfloat16, fp16/float16/half (case-insensitive).
absl::StatusOr<DType> ParseDType(absl::string_view text);

}  // namespace zerod

#endif  // ZEROD_RUNTIME_COMMON_DTYPE_H_
