#include "runtime/common/dtype.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace zerod {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "fp32";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat16:
      return "fp16";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "fp32" || t == "float32" || t == "float") return DType::kFloat32;
  if (t == "bf16" || t == "bfloat16") return DType::kBFloat16;
  if (t == "fp16" || t == "float16" || t == "half") return DType::kFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", text, "' (expected fp32, bf16 or fp16)"));
}

}  // namespace zerod
