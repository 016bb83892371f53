// A checkpoint directory's names, its manifest on disk, and whether a model can load it.

#include "runtime/checkpoint/checkpoint_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "runtime/checkpoint/internal/damage.h"
#include "runtime/checkpoint/internal/file_io.h"
#include "runtime/checkpoint/internal/manifest_checks.h"
#include "runtime/common/safe_file.h"
#include "runtime/common/status_macros.h"

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

// FAILED_PRECONDITION when `dir` itself is a symbolic link: a link named like a step reads as the
// step it points to.
absl::Status NotALink(const std::string& dir) {
  const std::string path = WithoutTrailingSlashes(dir);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint directory ", path, " is a symbolic link (to ", LinkTarget(path),
      "): a checkpoint is read from the directory its save wrote, never through a link"));
}

// Whether `name` is what an interrupted rewrite of the manifest leaves (`zeroctl checkpoint
// upgrade` killed before its rename: safe_file's `manifest.json.XXXXXX.tmp`), never read.
bool IsManifestTemporary(const std::string& name) {
  const std::string prefix = absl::StrCat(kManifestName, ".");
  return name.size() == prefix.size() + 6 + 4 && absl::StartsWith(name, prefix) &&
         absl::EndsWith(name, ".tmp");
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

namespace internal {

absl::StatusOr<Manifest> ReadManifest(const std::string& dir, bool legacy) {
  ZEROD_RETURN_IF_ERROR(NotALink(dir));
  const std::string path = absl::StrCat(dir, "/", kManifestName);
  auto text = ReadWholeFile(path);
  if (absl::IsNotFound(text.status())) return NoManifest(dir);
  if (!text.ok()) return text.status();
  ZEROD_ASSIGN_OR_RETURN(Manifest manifest, legacy ? LegacyManifestFromJson(*text, path)
                                                   : ManifestFromJson(*text, path));
  const std::string trimmed = WithoutTrailingSlashes(dir);
  const int64_t named = StepOfDirectoryName(std::filesystem::path(trimmed).filename());
  if (named >= 0 && named != manifest.step) {
    return Damage(absl::DataLossError(
        absl::StrCat(trimmed, " holds the checkpoint of step ", manifest.step,
                     " (its manifest says so), not of step ", named,
                     ": a checkpoint copied or renamed under another step's name is not loaded")));
  }
  return manifest;
}

}  // namespace internal

absl::StatusOr<Manifest> ReadManifest(const std::string& dir) {
  return internal::ReadManifest(dir, /*legacy=*/false);
}

absl::Status CheckFiles(const std::string& dir, const Manifest& manifest) {
  std::map<std::string, const RankFile*> listed;
  for (const RankFile& f : manifest.files) listed[f.name] = &f;
  std::string stray;  // the first file the manifest does not list
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string path = absl::StrCat(dir, "/", name);
    // NFS keeps a file removed while open as .nfsXXXX until it is closed: not a stray file.
    if (name == kManifestName || absl::StartsWith(name, ".nfs") || IsManifestTemporary(name)) {
      continue;
    }
    auto file = listed.find(name);
    if (file == listed.end()) {
      if (stray.empty()) stray = path;
      continue;
    }
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return FileError(errno, "cannot stat", path);
    if (!S_ISREG(st.st_mode)) {
      return internal::Damage(absl::FailedPreconditionError(absl::StrCat(
          path, " is not a regular file (a link, a FIFO or a device is never read as one)")));
    }
    ZEROD_RETURN_IF_ERROR(internal::CheckSize(path, st.st_size, file->second->bytes));
    listed.erase(file);
  }
  if (ec) return FileError(ec.value(), "cannot list", dir);
  if (!listed.empty()) {
    return internal::Damage(
        absl::NotFoundError(absl::StrCat(dir, "/", listed.begin()->first, " is missing")));
  }
  if (!stray.empty()) {
    // Not damage: the checkpoint's own files are intact. Refused all the same (never set aside),
    // so that nothing but one save's files is ever taken for a checkpoint.
    return absl::FailedPreconditionError(absl::StrCat(
        stray,
        " is not listed in its manifest: a checkpoint directory holds its save's files alone; "
        "move this one out of it"));
  }
  return absl::OkStatus();
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
