#ifndef ZEROD_RUNTIME_COMM_GLOO_CHUNKS_H_
#define ZEROD_RUNTIME_COMM_GLOO_CHUNKS_H_

// A buffer of `count` elements seen as `world` chunks for the ring collectives: chunk i holds
// elements [i * per_chunk, (i + 1) * per_chunk), clipped to the count. A reduce-scatter or an
// all-gather passes world x chunk elements, so every chunk is full; an all-reduce made of the two
// passes any count, and per_chunk = ceil(count / world) leaves the last chunks shorter (or
// empty) instead of padding the caller's buffer.

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace zerod::comm::internal {

struct Chunks {
  int64_t count = 0;
  int64_t per_chunk = 0;
  int64_t element_bytes = 0;

  static Chunks Even(int64_t world, int64_t per_chunk, int64_t element_bytes) {
    return {world * per_chunk, per_chunk, element_bytes};
  }
  static Chunks Split(int64_t world, int64_t count, int64_t element_bytes) {
    return {count, (count + world - 1) / world, element_bytes};
  }
  size_t offset(int64_t i) const {
    return static_cast<size_t>(std::min(i * per_chunk, count) * element_bytes);
  }
  size_t bytes(int64_t i) const {
    return static_cast<size_t>(std::min((i + 1) * per_chunk, count) * element_bytes) - offset(i);
  }
  size_t max_bytes() const { return static_cast<size_t>(per_chunk * element_bytes); }
  size_t total_bytes() const { return static_cast<size_t>(count * element_bytes); }
};

}  // namespace zerod::comm::internal

#endif  // ZEROD_RUNTIME_COMM_GLOO_CHUNKS_H_
