#include "runtime/checkpoint/internal/manifest_checks.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/checkpoint/internal/damage.h"
#include "runtime/plan/digest.h"

namespace zerod::checkpoint::internal {
namespace {

absl::Status CheckFile(const RankFile& f, int64_t index, const std::string& source) {
  const std::string at = absl::StrCat(source, ": file ", f.name, ": ");
  if (f.rank != index) {
    return absl::DataLossError(absl::StrCat(at, "rank ", f.rank, " is listed at position ", index));
  }
  if (f.name != RankFileName(f.rank)) {
    return absl::DataLossError(
        absl::StrCat(at, "rank ", f.rank, "'s file must be called ", RankFileName(f.rank)));
  }
  int64_t numel = 0;
  int64_t end = 0;
  for (const engine::ModelRun& run : f.runs) {
    if (run.offset < end || run.numel <= 0 || run.offset > plan::kMaxPlanNumel ||
        run.numel > plan::kMaxPlanNumel - numel) {
      return absl::DataLossError(absl::StrCat(at, "run [", run.offset, ", +", run.numel,
                                              ") is empty or not after the previous one"));
    }
    end = run.offset + run.numel;
    numel += run.numel;
  }
  if (numel != f.numel) {
    return absl::DataLossError(
        absl::StrCat(at, "runs hold ", numel, " elements, the file says ", f.numel));
  }
  if (f.extra_bytes < 0 || f.extra_bytes > (int64_t{1} << 60) ||
      f.bytes != 12 * f.numel + f.extra_bytes) {
    return absl::DataLossError(absl::StrCat(at, "size ", f.bytes, " is not 12 x ", f.numel,
                                            " elements + ", f.extra_bytes, " extra bytes"));
  }
  const int64_t blocks = (f.bytes + kChecksumBlockBytes - 1) / kChecksumBlockBytes;
  if (static_cast<int64_t>(f.block_xxh3.size()) != blocks) {
    return absl::DataLossError(absl::StrCat(at, f.block_xxh3.size(), " block checksums for ",
                                            blocks, " blocks of ", kChecksumBlockBytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSize(const std::string& path, int64_t actual, int64_t expected) {
  if (actual < expected) {
    return Damage(absl::DataLossError(
        absl::StrCat(path, " is truncated: ", actual, " bytes, the manifest says ", expected)));
  }
  if (actual > expected) {
    return Damage(absl::DataLossError(
        absl::StrCat(path, " holds ", actual, " bytes, the manifest says ", expected)));
  }
  return absl::OkStatus();
}

absl::Status CheckManifest(const Manifest& m, const std::string& source) {
  int64_t layout_numel = 0;
  for (const plan::TensorSpec& t : m.layout) layout_numel += t.numel();
  if (m.total_numel != layout_numel) {
    return absl::DataLossError(absl::StrCat(source, ": total_numel ", m.total_numel,
                                            " differs from the layout's ", layout_numel));
  }
  const std::string digest = plan::DigestHex(plan::LayoutDigest(m.layout));
  if (m.layout_digest != digest) {
    return absl::DataLossError(absl::StrCat(source, ": layout_digest ", m.layout_digest,
                                            " differs from the layout's ", digest));
  }
  if (m.world_size != static_cast<int64_t>(m.files.size())) {
    return absl::DataLossError(absl::StrCat(source, ": world_size ", m.world_size, " but ",
                                            m.files.size(), " rank files"));
  }
  std::vector<std::pair<engine::ModelRun, int64_t>> runs;  // with the file's rank
  for (size_t i = 0; i < m.files.size(); ++i) {
    absl::Status s = CheckFile(m.files[i], static_cast<int64_t>(i), source);
    if (!s.ok()) return s;
    for (const engine::ModelRun& run : m.files[i].runs) runs.push_back({run, m.files[i].rank});
  }
  std::sort(runs.begin(), runs.end(),
            [](const auto& a, const auto& b) { return a.first.offset < b.first.offset; });
  int64_t covered = 0;
  for (const auto& [run, rank] : runs) {
    if (run.offset != covered) {
      return absl::DataLossError(absl::StrCat(
          source, ": ", RankFileName(rank), " starts a run at element ", run.offset, " where ",
          run.offset < covered ? "another file's run already covers it"
                               : absl::StrCat("elements from ", covered, " are in no file")));
    }
    covered += run.numel;
  }
  if (covered != m.total_numel) {
    return absl::DataLossError(
        absl::StrCat(source, ": the files cover ", covered, " of ", m.total_numel, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace zerod::checkpoint::internal
