// Layout files (client/layout_json.h): JSON text to tensors; a layout that parses is then checked
// and planned the way zeroctl plan and the SDK do, over a small world.

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "client/layout_json.h"
#include "runtime/plan/shard_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto tensors = zerod::client::ParseLayoutJson(text, zerod::DType::kBFloat16);
  if (!tensors.ok()) return 0;
  zerod::plan::PlanInput input;
  input.tensors = *std::move(tensors);
  input.options.world_size = 1 + static_cast<int64_t>(size % 8);
  input.options.stage = static_cast<int>(size % 5) - 1;  // auto, 0, 1, 2, 3
  if (!zerod::plan::ValidatePlanInput(input).ok()) return 0;
  auto plan = zerod::plan::ShardPlan::Create(std::move(input));
  if (plan.ok()) (void)plan->DigestHex();
  return 0;
}
