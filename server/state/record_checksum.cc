#include "server/state/record_checksum.h"

// The state type on the stack (no allocation per record); the header and library are one package.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace zerod::server {
namespace {

void Update(XXH3_state_t* state, uint64_t n) {
  unsigned char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(n >> (8 * i));
  XXH3_64bits_update(state, bytes, sizeof bytes);
}

}  // namespace

uint64_t RecordChecksum(const KeyValue& kv) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  Update(&state, kv.key.size());
  XXH3_64bits_update(&state, kv.key.data(), kv.key.size());
  Update(&state, kv.value.size());
  XXH3_64bits_update(&state, kv.value.data(), kv.value.size());
  Update(&state, static_cast<uint64_t>(kv.create_revision));
  Update(&state, static_cast<uint64_t>(kv.mod_revision));
  Update(&state, static_cast<uint64_t>(kv.version));
  return XXH3_64bits_digest(&state);
}

}  // namespace zerod::server
