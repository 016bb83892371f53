// A checkpoint's manifest.json (runtime/checkpoint): untrusted input, since a checkpoint directory
// may come from anywhere. A manifest that parses passed every consistency check (its checksum
// first); it is then written back, which must parse again to the same text, and matched against a
// layout. The same input is also read as UpgradeManifest reads it, where a format-1 manifest has no
// checksum to stop a mutation before the field checks.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/internal/manifest_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto manifest = zerod::checkpoint::ManifestFromJson(text, "manifest.json");
  if (!manifest.ok()) {
    manifest = zerod::checkpoint::internal::LegacyManifestFromJson(text, "manifest.json");
    if (!manifest.ok()) return 0;
    manifest->format_version = zerod::checkpoint::kFormatVersion;  // as UpgradeManifest writes it
  }
  const std::string again = zerod::checkpoint::ManifestToJson(*manifest);
  auto back = zerod::checkpoint::ManifestFromJson(again, "manifest.json");
  if (!back.ok() || zerod::checkpoint::ManifestToJson(*back) != again) std::abort();
  (void)zerod::checkpoint::CheckLayout(*manifest, manifest->layout, "dir");
  return 0;
}
