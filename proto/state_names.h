#ifndef ZEROD_PROTO_STATE_NAMES_H_
#define ZEROD_PROTO_STATE_NAMES_H_

// The lower-case names zerod's views give the wire's states (the status page, /metrics).

#include "zerod/v1/coordinator.pb.h"

namespace zerod::proto {

// "forming", "running", "degraded", "ended"; "unknown" for anything else.
const char* JobStateName(v1::JobState state);
// "saving", "complete", "removed", "set aside"; "unknown" for anything else.
const char* CheckpointStateName(v1::CheckpointState state);

}  // namespace zerod::proto

#endif  // ZEROD_PROTO_STATE_NAMES_H_
