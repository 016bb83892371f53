#include "runtime/checkpoint/internal/selection.h"

#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "runtime/checkpoint/internal/checksums.h"
#include "runtime/common/safe_file.h"
#include "runtime/common/status_macros.h"

namespace zerod::checkpoint::internal {
namespace {

namespace fs = std::filesystem;

std::string LinkTarget(const std::string& path) {
  char target[4096];
  const ssize_t n = ::readlink(path.c_str(), target, sizeof(target) - 1);
  return n > 0 ? std::string(target, static_cast<size_t>(n)) : "?";
}

// Another job's records by directory, asked once per job and scan.
using OthersRecords =
    std::map<std::string, absl::StatusOr<std::map<std::string, CheckpointRecordInfo>>>;

const absl::StatusOr<std::map<std::string, CheckpointRecordInfo>>& RecordsOf(
    const std::string& job_id, Recorder& recorder, OthersRecords& others) {
  auto it = others.find(job_id);
  if (it != others.end()) return it->second;
  absl::StatusOr<std::map<std::string, CheckpointRecordInfo>> by_dir =
      std::map<std::string, CheckpointRecordInfo>{};
  absl::StatusOr<std::vector<CheckpointRecordInfo>> records = recorder.ListOf(job_id);
  if (!records.ok()) {
    by_dir = records.status();
  } else {
    for (CheckpointRecordInfo& r : *records) (*by_dir)[Absolute(r.directory)] = std::move(r);
  }
  return others.emplace(job_id, std::move(by_dir)).first->second;
}

// Whether `d`, which this job has no record of, counts: empty when it does (an unrecorded snapshot
// of this job, or a checkpoint the job that saved it recorded there), else why not.
std::string WhyNotCounted(StepDir& d, Recorder& recorder, OthersRecords& others) {
  const std::string& me = recorder.job_id();
  const std::string not_ours = absl::StrCat("not in job ", me, "'s records");
  absl::StatusOr<Manifest> m = ReadManifest(d.dir);
  if (!m.ok()) {
    return absl::StrCat(not_ours,
                        ", and its manifest does not say whose it is: ", m.status().message());
  }
  if (!m->recorded) {
    if (m->job_id == me) return "";
    return absl::StrCat(not_ours, ": an in-memory snapshot of job ", m->job_id);
  }
  if (m->job_id == me) {
    return absl::StrCat(not_ours,
                        ", though its manifest names this job (copied in from "
                        "elsewhere, or its records are gone)");
  }
  const auto& theirs = RecordsOf(m->job_id, recorder, others);
  if (!theirs.ok()) {
    return absl::StrCat(not_ours, ": saved by job ", m->job_id, ", whose records cannot be read (",
                        theirs.status().message(), "); name the directory to load it");
  }
  auto r = theirs->find(d.dir);
  if (r == theirs->end() || r->second.state != RecordState::kComplete) {
    return absl::StrCat(not_ours, ": saved by job ", m->job_id,
                        ", which did not record it complete here (copied in?)");
  }
  if (r->second.manifest_xxh3 != 0 && r->second.manifest_xxh3 != m->manifest_xxh3) {
    return absl::StrCat(not_ours, ": its manifest is not the one job ", m->job_id,
                        " recorded here");
  }
  d.saved_by = m->job_id;
  d.recorded_manifest_xxh3 = r->second.manifest_xxh3;
  return "";
}

}  // namespace

std::string Absolute(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec);
  return (ec ? fs::path(path) : p).lexically_normal().string();
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

absl::StatusOr<std::vector<StepDir>> Scan(const std::string& root, Recorder* recorder) {
  std::vector<StepDir> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  ZEROD_ASSIGN_OR_RETURN(auto records, RecordsByDirectory(recorder));
  OthersRecords others;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = StepOfDirectoryName(it->path().filename().string());
    if (step < 0) continue;
    StepDir d{step, Absolute(it->path().string())};
    // A link (an operator's "best" pointing at a checkpoint, or one planted) is not one of this
    // job's: loaded, it would read as the step it points to; removed through, it would take that
    // checkpoint with it.
    if (it->is_symlink(ec)) {
      d.skipped = Skipped::kNotThisJobs;
      d.why =
          absl::StrCat("a symbolic link (to ", LinkTarget(d.dir), "), not a directory a save made");
      out.push_back(std::move(d));
      continue;
    }
    if (!it->is_directory(ec)) continue;
    if (auto r = records.find(d.dir); r != records.end()) {
      d.record = r->second;
      d.recorded_manifest_xxh3 = r->second.manifest_xxh3;
    }
    if (!HasManifest(d.dir)) {
      d.skipped = Skipped::kPartial;
      d.why = "rank files but no manifest.json";
    } else if (d.record && d.record->state != RecordState::kComplete) {
      d.skipped = Skipped::kPartial;
      d.why = absl::StrCat("the coordinator's record says ", StateName(d.record->state));
    } else if (recorder != nullptr && !d.record) {
      d.why = WhyNotCounted(d, *recorder, others);
      if (!d.why.empty()) d.skipped = Skipped::kNotThisJobs;
    }
    out.push_back(std::move(d));
  }
  if (ec) {
    return absl::InternalError(absl::StrCat("checkpoint: cannot list ", root, ": ", ec.message()));
  }
  std::sort(out.begin(), out.end(),
            [](const StepDir& a, const StepDir& b) { return a.step < b.step; });
  return out;
}

std::string Describe(const std::vector<StepDir>& dirs) {
  std::vector<std::string> parts;
  for (const StepDir& d : dirs) parts.push_back(absl::StrCat(d.dir, " (", d.why, ")"));
  return absl::StrJoin(parts, ", ");
}

absl::StatusOr<Manifest> Vet(const StepDir& d, const std::string& recorded_by) {
  ZEROD_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(d.dir));
  if (d.recorded_manifest_xxh3 != 0 && d.recorded_manifest_xxh3 != manifest.manifest_xxh3) {
    return absl::DataLossError(absl::StrCat(
        d.dir, "/", kManifestName, " is not the manifest job ", recorded_by,
        " recorded complete (its checksum is ", HashHex(manifest.manifest_xxh3), ", the record's ",
        HashHex(d.recorded_manifest_xxh3), "): the checkpoint was replaced after its save"));
  }
  ZEROD_RETURN_IF_ERROR(CheckFiles(d.dir, manifest));
  return manifest;
}

std::string SetAside(const StepDir& d, Recorder* recorder) {
  if (!d.saved_by.empty()) return absl::StrCat("left in place: job ", d.saved_by, "'s");
  if (recorder != nullptr && d.record && d.record->state != RecordState::kRemoved) {
    CheckpointRecordInfo removed = *d.record;
    removed.state = RecordState::kRemoved;
    removed.bytes = 0;
    if (absl::Status s = recorder->Record(removed); !s.ok()) {
      return absl::StrCat("left in place: recording it removed failed: ", s.message());
    }
  }
  const std::string to = absl::StrCat(d.dir, ".damaged-", absl::ToUnixMillis(absl::Now()));
  if (::rename(d.dir.c_str(), to.c_str()) != 0) {
    return absl::StrCat("left in place: cannot rename it: ", std::strerror(errno));
  }
  (void)SyncDirectory(fs::path(d.dir).parent_path().string());
  return absl::StrCat("set aside as ", to);
}

}  // namespace zerod::checkpoint::internal
