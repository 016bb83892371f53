#include "runtime/plan/digest.h"

#include <xxhash.h>

#include <memory>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace zerod::plan {
namespace {

// Feeds little-endian fixed-width integers and length-prefixed strings into one XXH3 stream.
class DigestWriter {
 public:
  DigestWriter() : state_(XXH3_createState(), &XXH3_freeState) { XXH3_64bits_reset(state_.get()); }

  void Int(int64_t v) {
    unsigned char bytes[8];
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(v) >> (8 * i));
    XXH3_64bits_update(state_.get(), bytes, sizeof(bytes));
  }
  void Str(absl::string_view s) {
    Int(static_cast<int64_t>(s.size()));
    XXH3_64bits_update(state_.get(), s.data(), s.size());
  }
  uint64_t Finish() { return XXH3_64bits_digest(state_.get()); }

 private:
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state_;
};

void WriteLayout(DigestWriter& w, const std::vector<TensorSpec>& tensors, bool with_units) {
  w.Int(static_cast<int64_t>(tensors.size()));
  for (const TensorSpec& t : tensors) {
    w.Str(t.name);
    w.Int(static_cast<int64_t>(t.shape.size()));
    for (int64_t d : t.shape) w.Int(d);
    w.Int(static_cast<int64_t>(t.dtype));
    if (with_units) w.Str(t.unit);
  }
}

}  // namespace

uint64_t LayoutDigest(const std::vector<TensorSpec>& tensors) {
  DigestWriter w;
  w.Str("zerod.layout.v1");
  WriteLayout(w, tensors, /*with_units=*/false);
  return w.Finish();
}

uint64_t PlanDigest(const std::vector<TensorSpec>& tensors, const PlanOptions& o, int stage) {
  DigestWriter w;
  w.Str("zerod.plan.v1");
  WriteLayout(w, tensors, /*with_units=*/true);
  w.Int(o.world_size);
  w.Int(stage);
  w.Int(static_cast<int64_t>(o.param_dtype));
  w.Int(static_cast<int64_t>(o.grad_dtype));
  w.Int(static_cast<int64_t>(o.optimizer));
  w.Int(o.partition_alignment_numel);
  w.Int(o.reduce_bucket_bytes);
  w.Int(o.bucket_buffers);
  w.Int(o.gather_unit_bytes);
  w.Int(o.prefetch_depth);
  w.Int(o.max_live_units);
  return w.Finish();
}

std::string DigestHex(uint64_t digest) { return absl::StrFormat("%016x", digest); }

}  // namespace zerod::plan
