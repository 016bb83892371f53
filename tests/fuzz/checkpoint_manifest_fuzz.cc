// A checkpoint's manifest.json (runtime/checkpoint): untrusted input, since a checkpoint directory
// may come from anywhere. A manifest that parses passed every consistency check; it is then
// written back, which must parse again to the same text, and matched against a layout.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/checkpoint/checkpoint_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto manifest = zerod::checkpoint::ManifestFromJson(text, "manifest.json");
  if (!manifest.ok()) return 0;
  const std::string again = zerod::checkpoint::ManifestToJson(*manifest);
  auto back = zerod::checkpoint::ManifestFromJson(again, "manifest.json");
  if (!back.ok() || zerod::checkpoint::ManifestToJson(*back) != again) std::abort();
  (void)zerod::checkpoint::CheckLayout(*manifest, manifest->layout, "dir");
  return 0;
}
