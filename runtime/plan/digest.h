#ifndef ZEROD_RUNTIME_PLAN_DIGEST_H_
#define ZEROD_RUNTIME_PLAN_DIGEST_H_

// Stable 64-bit digests (XXH3) of a parameter layout and of a plan's inputs. Stable means: the
// same bytes on every machine and every run, independent of hash seeds or call order; each field
// is written with its length so that no two different inputs share a byte stream.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/plan/plan_input.h"

namespace zerod::plan {

// Names, shapes, dtypes and order of the tensors (not the gather-unit labels).
uint64_t LayoutDigest(const std::vector<TensorSpec>& tensors);

// The layout, every option that shapes the plan (not the budget), and the resolved stage.
uint64_t PlanDigest(const std::vector<TensorSpec>& tensors, const PlanOptions& options, int stage);

// 16 lower-case hex digits.
std::string DigestHex(uint64_t digest);

}  // namespace zerod::plan

#endif  // ZEROD_RUNTIME_PLAN_DIGEST_H_
