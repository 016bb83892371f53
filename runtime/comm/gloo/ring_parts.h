#ifndef ZEROD_RUNTIME_COMM_GLOO_RING_PARTS_H_
#define ZEROD_RUNTIME_COMM_GLOO_RING_PARTS_H_

// The buffers of a (grouped) reduce-scatter, all-gather or all-reduce as the Gloo communicator's
// transports see them: each a part of `world` chunks (chunks.h). Step `i` is chunk `i` of every
// part, end to end: what a ring step, or a shared-memory piece for rank `i`, moves.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/comm/gloo/chunks.h"

namespace zerod::comm::internal {

// One buffer: its world chunks.
struct RingPart {
  char* data;
  Chunks chunks;
};

// Chunk `i` of every part, end to end: what one ring step sends or receives.
inline size_t StepBytes(const std::vector<RingPart>& parts, int64_t i) {
  size_t bytes = 0;
  for (const auto& part : parts) bytes += part.chunks.bytes(i);
  return bytes;
}

inline size_t MaxStepBytes(const std::vector<RingPart>& parts, int64_t world) {
  size_t most = 0;
  for (int64_t i = 0; i < world; ++i) most = std::max(most, StepBytes(parts, i));
  return most;
}

// Calls fn(in_part, n, from) for each part's share of bytes [begin, begin + bytes) of the packed
// step of chunk `i` (chunk `i` of every part, end to end): `n` bytes at `in_part` in the part,
// which sit at offset `from` of the packed step.
template <typename Fn>
void ForEachInStep(const std::vector<RingPart>& parts, int64_t i, size_t begin, size_t bytes,
                   Fn&& fn) {
  const size_t end = begin + bytes;
  size_t from = 0;  // where the part's chunk starts in the packed step
  for (const auto& part : parts) {
    if (from >= end) return;
    const size_t chunk_bytes = part.chunks.bytes(i);
    const size_t lo = std::max(from, begin), hi = std::min(from + chunk_bytes, end);
    if (lo < hi) fn(part.data + part.chunks.offset(i) + (lo - from), hi - lo, lo);
    from += chunk_bytes;
  }
}

// Copies bytes [begin, begin + bytes) of the packed step of chunk `i` to where they sit in `out`
// (the packed step's memory).
inline void PackRange(const std::vector<RingPart>& parts, int64_t i, size_t begin, size_t bytes,
                      char* out) {
  ForEachInStep(parts, i, begin, bytes, [&](const char* in_part, size_t n, size_t from) {
    std::memcpy(out + from, in_part, n);
  });
}

}  // namespace zerod::comm::internal

#endif  // ZEROD_RUNTIME_COMM_GLOO_RING_PARTS_H_
