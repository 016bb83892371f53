#ifndef ZEROD_RUNTIME_CHECKPOINT_INTERNAL_DAMAGE_H_
#define ZEROD_RUNTIME_CHECKPOINT_INTERNAL_DAMAGE_H_

// Which failures say that a checkpoint is damaged: its bytes or its files are not what its
// manifest (or the job's record of it) says. Only the checks that find that mark a status so
// (checksums, sizes, a listed file missing, a manifest that does not parse or was replaced); a
// load falls back past a checkpoint for such a failure alone, and only after rank 0 has found the
// damage itself (load_protocol.cc). Everything else (a directory a rank cannot see, a permission,
// an I/O or store error) is no reason to take an older checkpoint or to set this one aside, so
// nothing infers damage from a status code.

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace zerod::checkpoint::internal {

inline constexpr absl::string_view kDamagePayload = "type.zerod.dev/checkpoint.Damaged";

// `s` marked as damage (an OK status stays OK).
inline absl::Status Damage(absl::Status s) {
  if (!s.ok()) s.SetPayload(kDamagePayload, absl::Cord("1"));
  return s;
}

inline bool IsDamage(const absl::Status& s) {
  return !s.ok() && s.GetPayload(kDamagePayload).has_value();
}

}  // namespace zerod::checkpoint::internal

#endif  // ZEROD_RUNTIME_CHECKPOINT_INTERNAL_DAMAGE_H_
