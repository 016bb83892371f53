#include "runtime/checkpoint/internal/selection.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "runtime/checkpoint/internal/checksums.h"
#include "runtime/checkpoint/internal/damage.h"
#include "runtime/common/safe_file.h"
#include "runtime/common/status_macros.h"

namespace zerod::checkpoint::internal {
namespace {

namespace fs = std::filesystem;

// Empty when the unrecorded snapshots in `root` may be taken for the job's: a directory (not a
// link) of this user's that no one else may write, as zerorun makes it (mkdtemp). Else why not.
std::string SnapshotRootProblem(const std::string& root) {
  struct stat st;
  if (::lstat(root.c_str(), &st) != 0) return absl::StrCat(root, ", which cannot be looked at");
  if (!S_ISDIR(st.st_mode)) return absl::StrCat(root, ", which is not a directory but a link");
  if (st.st_uid != ::geteuid()) {
    return absl::StrCat(root, ", which belongs to uid ", st.st_uid, ", not this user (uid ",
                        ::geteuid(), ")");
  }
  if ((st.st_mode & 022) != 0) {
    return absl::StrCat(root, ", which others may write (mode ",
                        absl::StrFormat("%04o", st.st_mode & 07777), ")");
  }
  return "";
}

// Whether `d`, which this job has no record of, counts: empty when it does (an unrecorded snapshot
// of this job in a snapshot root of this user's), else why not (d.whole: it is a checkpoint).
std::string WhyNotCounted(StepDir& d, RootKind kind, const std::string& root, Recorder& recorder) {
  const std::string& me = recorder.job_id();
  const std::string not_ours = absl::StrCat("not in job ", me, "'s records");
  absl::StatusOr<Manifest> m = ReadManifest(d.dir);
  if (!m.ok()) {
    return absl::StrCat(not_ours,
                        ", and its manifest does not say whose it is: ", m.status().message());
  }
  d.whole = true;
  if (!m->recorded) {
    if (m->job_id != me)
      return absl::StrCat(not_ours, ": an in-memory snapshot of job ", m->job_id);
    if (kind != RootKind::kSnapshots) {
      return absl::StrCat(not_ours,
                          ": an unrecorded snapshot, taken only from the job's snapshot directory "
                          "($ZEROD_SNAPSHOT_DIR), never from a checkpoint root (copied in?)");
    }
    if (const std::string problem = SnapshotRootProblem(root); !problem.empty()) {
      return absl::StrCat(not_ours, ": an unrecorded snapshot in ", problem);
    }
    return "";
  }
  if (m->job_id == me) {
    return absl::StrCat(not_ours,
                        ", though its manifest names this job (copied in, the root moved, or the "
                        "records are gone); name the directory to load it");
  }
  return absl::StrCat(not_ours, ": saved by job ", m->job_id,
                      "; another job's checkpoint loads only when its directory is named");
}

// The job's complete (or set-aside) records of `root`'s step directories that `seen` lacks.
std::vector<StepDir> Missing(const std::string& root,
                             const std::map<std::string, CheckpointRecordInfo>& records,
                             const std::vector<StepDir>& seen, bool root_exists) {
  std::vector<StepDir> out;
  for (const auto& [dir, r] : records) {
    if (r.state != RecordState::kComplete && r.state != RecordState::kSetAside) continue;
    if (fs::path(dir).parent_path().string() != root) continue;
    // Captured by name: clang 14 cannot capture a structured binding.
    if (std::any_of(seen.begin(), seen.end(),
                    [&dir = dir](const StepDir& d) { return d.dir == dir; })) {
      continue;
    }
    StepDir d{r.step, dir, Skipped::kMissing};
    d.record = r;
    if (!root_exists) {
      d.why = absl::StrCat("recorded ", StateName(r.state), ", but ", root,
                           " does not exist here (is its filesystem mounted?)");
    } else if (r.state == RecordState::kSetAside) {
      d.why = absl::StrCat("set aside earlier (look for ", fs::path(dir).filename().string(),
                           ".damaged-*; put it back as ", fs::path(dir).filename().string(),
                           " to have it checked again)");
    } else {
      d.why = "recorded complete, but its directory is missing";
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace

std::string Absolute(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec);
  return WithoutTrailingSlashes((ec ? fs::path(path) : p).lexically_normal().string());
}

bool HasManifest(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kManifestName, ec);
}

const char* StateName(RecordState state) {
  switch (state) {
    case RecordState::kSaving:
      return "saving";
    case RecordState::kComplete:
      return "complete";
    case RecordState::kRemoved:
      return "removed";
    case RecordState::kSetAside:
      return "set aside";
  }
  return "?";
}

absl::StatusOr<std::map<std::string, CheckpointRecordInfo>> RecordsByDirectory(Recorder* recorder) {
  std::map<std::string, CheckpointRecordInfo> out;
  if (recorder == nullptr) return out;
  ZEROD_ASSIGN_OR_RETURN(std::vector<CheckpointRecordInfo> records, recorder->List());
  for (CheckpointRecordInfo& r : records) {
    const std::string dir = Absolute(r.directory);
    out[dir] = std::move(r);
  }
  return out;
}

absl::StatusOr<std::vector<StepDir>> Scan(const std::string& root, RootKind kind,
                                          Recorder* recorder) {
  std::vector<StepDir> out;
  ZEROD_ASSIGN_OR_RETURN(auto records, RecordsByDirectory(recorder));
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return Missing(root, records, out, /*root_exists=*/false);
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = StepOfDirectoryName(it->path().filename().string());
    if (step < 0) continue;
    StepDir d{step, Absolute(it->path().string())};
    if (auto r = records.find(d.dir); r != records.end()) {
      d.record = r->second;
      d.recorded_manifest_xxh3 = r->second.manifest_xxh3;
    }
    const bool recorded_complete = d.record && (d.record->state == RecordState::kComplete ||
                                                d.record->state == RecordState::kSetAside);
    // A link (an operator's "best" pointing at a checkpoint, or one planted) is not one of this
    // job's: loaded, it would read as the step it points to; removed through, it would take that
    // checkpoint with it.
    if (it->is_symlink(ec)) {
      d.skipped = Skipped::kNotThisJobs;
      d.why =
          absl::StrCat("a symbolic link (to ", LinkTarget(d.dir), "), not a directory a save made");
    } else if (!it->is_directory(ec)) {
      continue;
    } else if (!HasManifest(d.dir) && !recorded_complete) {
      // (Recorded complete without a manifest: a candidate that Vet finds damaged.)
      d.skipped = Skipped::kPartial;
      d.why = "rank files but no manifest.json";
    } else if (d.record && !recorded_complete) {
      d.skipped = Skipped::kPartial;
      d.why = absl::StrCat("the coordinator's record says ", StateName(d.record->state));
    } else if (recorder != nullptr && !d.record) {
      d.why = WhyNotCounted(d, kind, root, *recorder);
      if (!d.why.empty()) d.skipped = Skipped::kNotThisJobs;
    }
    out.push_back(std::move(d));
  }
  if (ec) {
    return absl::InternalError(absl::StrCat("checkpoint: cannot list ", root, ": ", ec.message()));
  }
  for (StepDir& d : Missing(root, records, out, /*root_exists=*/true)) out.push_back(std::move(d));
  std::sort(out.begin(), out.end(),
            [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return out;
}

std::string Describe(const std::vector<StepDir>& dirs) {
  std::vector<std::string> parts;
  for (const StepDir& d : dirs) parts.push_back(absl::StrCat(d.dir, " (", d.why, ")"));
  return absl::StrJoin(parts, ", ");
}

absl::StatusOr<Manifest> Vet(const StepDir& d, const std::string& job_id) {
  absl::StatusOr<Manifest> manifest = ReadManifest(d.dir);
  if (absl::IsNotFound(manifest.status()) && d.record && fs::is_directory(d.dir) &&
      !HasManifest(d.dir)) {
    return Damage(absl::DataLossError(
        absl::StrCat(d.dir, " has no ", kManifestName, ", but job ", job_id, " recorded it ",
                     StateName(d.record->state), ": its manifest was removed after its save")));
  }
  if (!manifest.ok()) return manifest.status();
  if (d.recorded_manifest_xxh3 != 0 && d.recorded_manifest_xxh3 != manifest->manifest_xxh3) {
    return Damage(absl::DataLossError(absl::StrCat(
        d.dir, "/", kManifestName, " is not the manifest job ", job_id,
        " recorded complete (its checksum is ", HashHex(manifest->manifest_xxh3), ", the record's ",
        HashHex(d.recorded_manifest_xxh3), "): the checkpoint was replaced after its save")));
  }
  ZEROD_RETURN_IF_ERROR(CheckFiles(d.dir, *manifest));
  return manifest;
}

std::string SetAside(const StepDir& d, Recorder* recorder) {
  std::string recorded;
  if (recorder != nullptr && d.record && d.record->state == RecordState::kComplete) {
    CheckpointRecordInfo aside = *d.record;
    aside.state = RecordState::kSetAside;
    if (absl::Status s = recorder->Record(aside); !s.ok()) {
      return absl::StrCat("left as it was: recording it set aside failed: ", s.message());
    }
    recorded = "recorded set aside";
  }
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(d.dir, ec))) {
    return recorded.empty() ? "nothing to set aside" : recorded;
  }
  const std::string to = absl::StrCat(d.dir, ".damaged-", absl::ToUnixMillis(absl::Now()));
  if (::rename(d.dir.c_str(), to.c_str()) != 0) {
    return absl::StrCat(recorded.empty() ? "" : recorded + ", ",
                        "left in place: cannot rename it: ", std::strerror(errno));
  }
  (void)SyncDirectory(fs::path(d.dir).parent_path().string());
  return absl::StrCat("set aside as ", to, recorded.empty() ? "" : ", " + recorded);
}

}  // namespace zerod::checkpoint::internal
