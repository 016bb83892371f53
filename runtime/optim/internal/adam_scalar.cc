#include "runtime/optim/internal/adam_element.h"

namespace zerod::optim::internal {

void AdamScalar(const AdamShard& s, const AdamScalars& k, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) AdamElement(s, k, i);
}

}  // namespace zerod::optim::internal
