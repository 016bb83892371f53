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

// `path` without trailing slashes (lstat of "link/" would follow the link).
std::string Trimmed(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// FAILED_PRECONDITION when `dir` itself is a symbolic link: a link named like a step reads as the
// step it points to.
absl::Status NotALink(const std::string& dir) {
  const std::string path = Trimmed(dir);
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return absl::OkStatus();
  char target[4096];
  const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
  const std::string to = n > 0 ? std::string(target, static_cast<size_t>(n)) : "?";
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint directory ", path, " is a symbolic link (to ", to,
      "): a checkpoint is read from the directory its save wrote, never through a link"));
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
  const int64_t named = StepOfDirectoryName(std::filesystem::path(Trimmed(dir)).filename());
  if (named >= 0 && named != manifest.step) {
    return absl::DataLossError(
        absl::StrCat(Trimmed(dir), " holds the checkpoint of step ", manifest.step,
                     " (its manifest says so), not of step ", named,
                     ": a checkpoint copied or renamed under another step's name is not loaded"));
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
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string path = absl::StrCat(dir, "/", name);
    // NFS keeps a file removed while open as .nfsXXXX until it is closed: not a stray file.
    if (name == kManifestName || absl::StartsWith(name, ".nfs")) continue;
    auto file = listed.find(name);
    if (file == listed.end()) {
      return absl::DataLossError(absl::StrCat(
          path,
          " is not listed in its manifest: a file of another save (a crashed world's, or "
          "copied in) is not kept beside a checkpoint"));
    }
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return FileError(errno, "cannot stat", path);
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " is not a regular file (a link, a FIFO or a device is never read as one)"));
    }
    ZEROD_RETURN_IF_ERROR(internal::CheckSize(path, st.st_size, file->second->bytes));
    listed.erase(file);
  }
  if (ec) return FileError(ec.value(), "cannot list", dir);
  if (!listed.empty()) {
    return absl::NotFoundError(absl::StrCat(dir, "/", listed.begin()->first, " is missing"));
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
