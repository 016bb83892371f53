// ExportSafetensors: the full fp32 parameters by name, in the safetensors format (an 8-byte
// little-endian header length, a JSON header padded with spaces to a multiple of 8, then the
// tensors' bytes), streamed from the rank files' master sections in model order.

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/internal/checked_files.h"
#include "runtime/checkpoint/internal/manifest_checks.h"
#include "runtime/checkpoint/internal/run_index.h"
#include "runtime/common/safe_file.h"
#include "runtime/common/status_macros.h"

namespace zerod::checkpoint {
namespace {

// Blocks kept while reading: one per file the model's order alternates between (every rank's
// slice of a segment in turn), up to a bound.
constexpr int kMaxCachedBlocks = 16;

std::string Header(const Manifest& m) {
  nlohmann::ordered_json header;
  // Values of __metadata__ must be strings.
  header["__metadata__"] = {{"format", "pt"},
                            {"zerod_job", m.job_id},
                            {"zerod_step", absl::StrCat(m.step)},
                            {"zerod_world_size", absl::StrCat(m.world_size)},
                            {"zerod_stage", absl::StrCat(m.stage)},
                            {"zerod_layout_digest", m.layout_digest}};
  int64_t offset = 0;
  for (const plan::TensorSpec& t : m.layout) {
    const int64_t bytes = t.numel() * 4;
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

}  // namespace

absl::Status ExportSafetensors(const std::string& dir, const std::string& out) {
  ZEROD_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(dir));
  const std::string header = Header(manifest);
  char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);

  ZEROD_ASSIGN_OR_RETURN(AtomicFileWriter file, AtomicFileWriter::Create(out));
  ZEROD_RETURN_IF_ERROR(file.Append(length, 8));
  ZEROD_RETURN_IF_ERROR(file.Append(header));
  internal::CheckedFiles files(
      dir, manifest, std::min<int>(kMaxCachedBlocks, static_cast<int>(manifest.files.size())) + 1);
  for (int64_t f = 0; f < static_cast<int64_t>(manifest.files.size()); ++f) {
    ZEROD_RETURN_IF_ERROR(files.Open(f));
  }
  const internal::RunIndex index(manifest);
  // The tensors lie end to end in model order, as their data does in the file.
  for (const internal::FilePiece& p : index.Find({0, manifest.total_numel})) {
    const RankFile& source = manifest.files[static_cast<size_t>(p.file)];
    int64_t offset = internal::SectionByteOffset(source, 0, p.element);
    for (int64_t left = p.numel * 4; left > 0;) {
      ZEROD_ASSIGN_OR_RETURN(absl::string_view part, files.ReadSome(p.file, offset, left));
      ZEROD_RETURN_IF_ERROR(file.Append(part));
      offset += static_cast<int64_t>(part.size());
      left -= static_cast<int64_t>(part.size());
    }
  }
  return file.Commit();
}

}  // namespace zerod::checkpoint
