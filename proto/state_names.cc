#include "proto/state_names.h"

namespace zerod::proto {

const char* JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_FORMING:
      return "forming";
    case v1::JOB_RUNNING:
      return "running";
    case v1::JOB_DEGRADED:
      return "degraded";
    case v1::JOB_ENDED:
      return "ended";
    default:
      return "unknown";
  }
}

const char* CheckpointStateName(v1::CheckpointState state) {
  switch (state) {
    case v1::CHECKPOINT_SAVING:
      return "saving";
    case v1::CHECKPOINT_COMPLETE:
      return "complete";
    case v1::CHECKPOINT_REMOVED:
      return "removed";
    case v1::CHECKPOINT_SET_ASIDE:
      return "set aside";
    default:
      return "unknown";
  }
}

}  // namespace zerod::proto
