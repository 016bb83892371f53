// A checkpoint directory's names, its manifest on disk, and whether a model can load it.

#include "runtime/checkpoint/checkpoint_files.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/checkpoint/internal/file_io.h"

namespace zerod::checkpoint {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Why `dir` has no manifest, in words.
absl::Status NoManifest(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat("checkpoint directory ", dir, " does not exist"));
  }
  int64_t done = 0, writing = 0, steps = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "step-")) ++steps;
    if (!absl::StartsWith(name, "rank-")) continue;
    if (absl::EndsWith(name, ".shard")) ++done;
    if (absl::EndsWith(name, ".tmp")) ++writing;
  }
  if (steps > 0 && done == 0 && writing == 0) {
    return absl::NotFoundError(absl::StrCat(dir, " is a checkpoint root (", steps,
                                            " step directories), not a checkpoint: name one of "
                                            "its step-* directories"));
  }
  return absl::NotFoundError(
      absl::StrCat("checkpoint ", dir, " is partial: ", done, " rank files",
                   writing ? absl::StrCat(" (", writing, " being written)") : "", " but no ",
                   kManifestName, " (a save that did not finish)"));
}

}  // namespace

std::string StepDirectory(const std::string& root, int64_t step) {
  return absl::StrFormat("%s/step-%012d", root, step);
}

int64_t StepOfDirectoryName(const std::string& name) {
  constexpr absl::string_view kPrefix = "step-";
  constexpr size_t kDigits = 12;
  int64_t step = -1;
  if (name.size() != kPrefix.size() + kDigits || !absl::StartsWith(name, kPrefix) ||
      !std::all_of(name.begin() + kPrefix.size(), name.end(),
                   [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(name.substr(kPrefix.size()), &step)) {
    return -1;
  }
  return step;
}

std::string RankFileName(int64_t rank) { return absl::StrFormat("rank-%05d.shard", rank); }

absl::StatusOr<Manifest> ReadManifest(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kManifestName);
  auto text = internal::ReadWholeFile(path);
  if (absl::IsNotFound(text.status())) return NoManifest(dir);
  if (!text.ok()) return text.status();
  return ManifestFromJson(*text, path);
}

absl::Status CheckLayout(const Manifest& manifest, const std::vector<plan::TensorSpec>& layout,
                         const std::string& dir) {
  const size_t common = std::min(manifest.layout.size(), layout.size());
  for (size_t i = 0; i < common; ++i) {
    const plan::TensorSpec& saved = manifest.layout[i];
    const plan::TensorSpec& here = layout[i];
    if (saved.name != here.name || saved.shape != here.shape) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", dir, " holds another model: tensor ", i, " is '", saved.name, "' ",
          ShapeText(saved.shape), " there and '", here.name, "' ", ShapeText(here.shape), " here"));
    }
  }
  if (manifest.layout.size() != layout.size()) {
    const bool more_saved = manifest.layout.size() > layout.size();
    const plan::TensorSpec& extra = more_saved ? manifest.layout[common] : layout[common];
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", dir, " holds another model: it has ", manifest.layout.size(),
                     " tensors and this model ", layout.size(), "; tensor '", extra.name,
                     "' is only ", more_saved ? "there" : "here"));
  }
  return absl::OkStatus();
}

}  // namespace zerod::checkpoint
