#ifndef ZEROD_RUNTIME_CHECKPOINT_INTERNAL_MANIFEST_CHECKS_H_
#define ZEROD_RUNTIME_CHECKPOINT_INTERNAL_MANIFEST_CHECKS_H_

// What makes a manifest self-consistent, checked wherever one is written or read: every file's
// runs sorted and adding up to its sizes, one checksum per block, the runs of all files covering
// [0, total_numel) exactly once, and total_numel and the layout digest agreeing with the layout.

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/checkpoint/checkpoint_files.h"

namespace zerod::checkpoint::internal {

// DATA_LOSS naming `source` and the file or field at fault.
absl::Status CheckManifest(const Manifest& manifest, const std::string& source);

// ManifestFromJson that also reads a format-1 manifest, which has no checksum (UpgradeManifest).
absl::StatusOr<Manifest> LegacyManifestFromJson(const std::string& text, const std::string& source);

// ReadManifest (checkpoint_files.h); `legacy`: a format-1 manifest is read too.
absl::StatusOr<Manifest> ReadManifest(const std::string& dir, bool legacy);

// OK when a file at `path` of `actual` bytes has the `expected` size its manifest lists; else
// DATA_LOSS "X is truncated: N bytes, the manifest says M" (or "X holds N bytes, ..."), damage.
absl::Status CheckSize(const std::string& path, int64_t actual, int64_t expected);

// Where element `element` (an index into a file's sections) starts in section `section`.
inline int64_t SectionByteOffset(const RankFile& file, int section, int64_t element) {
  return (static_cast<int64_t>(section) * file.numel + element) * 4;
}

}  // namespace zerod::checkpoint::internal

#endif  // ZEROD_RUNTIME_CHECKPOINT_INTERNAL_MANIFEST_CHECKS_H_
