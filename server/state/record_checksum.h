#ifndef ZEROD_SERVER_STATE_RECORD_CHECKSUM_H_
#define ZEROD_SERVER_STATE_RECORD_CHECKSUM_H_

// The checksum stored beside every KvStore record (XXH3-64 over key, value and revisions), so
// that bytes changed on disk inside a value, which SQLite's own page checks cannot see, are found
// when the record is read back instead of being served.

#include <cstdint>

#include "server/state/kv_store.h"

namespace zerod::server {

// Every field, length-prefixed, so that moving bytes between key and value changes the sum.
uint64_t RecordChecksum(const KeyValue& kv);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_STATE_RECORD_CHECKSUM_H_
