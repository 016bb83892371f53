// Verify: every byte of a checkpoint read once and checked against its manifest.

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/internal/checksums.h"
#include "runtime/checkpoint/internal/damage.h"
#include "runtime/checkpoint/internal/file_io.h"
#include "runtime/checkpoint/internal/manifest_checks.h"
#include "runtime/common/status_macros.h"

namespace zerod::checkpoint {
namespace {

constexpr int64_t kReadBytes = int64_t{8} << 20;

absl::Status VerifyFile(const std::string& path, const RankFile& want) {
  absl::StatusOr<internal::ReadOnlyFile> opened = internal::ReadOnlyFile::Open(path);
  // A file the manifest lists, missing: damage (any other failure to open it is not).
  if (absl::IsNotFound(opened.status())) return internal::Damage(opened.status());
  ZEROD_ASSIGN_OR_RETURN(internal::ReadOnlyFile file, std::move(opened));
  ZEROD_RETURN_IF_ERROR(internal::CheckSize(path, file.size(), want.bytes));
  internal::FileHasher hasher(kChecksumBlockBytes);
  std::vector<char> buffer(
      static_cast<size_t>(std::min(kReadBytes, std::max<int64_t>(want.bytes, 1))));
  for (int64_t at = 0; at < want.bytes;) {
    const int64_t n = std::min(static_cast<int64_t>(buffer.size()), want.bytes - at);
    ZEROD_RETURN_IF_ERROR(file.ReadAt(at, n, buffer.data()));
    hasher.Update(buffer.data(), n);
    at += n;
  }
  hasher.Finish();
  for (size_t b = 0; b < want.block_xxh3.size(); ++b) {
    if (hasher.blocks()[b] != want.block_xxh3[b]) {
      const int64_t begin = static_cast<int64_t>(b) * kChecksumBlockBytes;
      const int64_t end = std::min(begin + kChecksumBlockBytes, want.bytes);
      return internal::Damage(
          absl::DataLossError(absl::StrCat(path, ": checksum mismatch in block ", b, " (bytes ",
                                           begin, "-", end - 1, "): the file is damaged")));
    }
  }
  if (hasher.whole() != want.xxh3) {
    return internal::Damage(absl::DataLossError(
        absl::StrCat(path, ": checksum of the whole file is ", internal::HashHex(hasher.whole()),
                     ", the manifest says ", internal::HashHex(want.xxh3))));
  }
  return absl::OkStatus();
}

// Every file of `manifest` read whole and checked, and nothing else in `dir`.
absl::Status VerifyFiles(const std::string& dir, const Manifest& manifest) {
  ZEROD_RETURN_IF_ERROR(CheckFiles(dir, manifest));
  for (const RankFile& f : manifest.files) {
    ZEROD_RETURN_IF_ERROR(VerifyFile(absl::StrCat(dir, "/", f.name), f));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Verify(const std::string& dir) {
  // ReadManifest checks the manifest itself: its checksum, sizes that add up, runs that cover the
  // model once.
  ZEROD_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(dir));
  return VerifyFiles(dir, manifest);
}

absl::Status UpgradeManifest(const std::string& dir) {
  ZEROD_ASSIGN_OR_RETURN(Manifest manifest, internal::ReadManifest(dir, /*legacy=*/true));
  if (manifest.format_version == kFormatVersion) return absl::OkStatus();
  ZEROD_RETURN_IF_ERROR(VerifyFiles(dir, manifest));
  manifest.format_version = kFormatVersion;
  manifest.recorded = true;  // format 1 did not say; a snapshot does not outlive its node anyway
  return WriteManifest(dir, manifest);
}

}  // namespace zerod::checkpoint
