#include "runtime/checkpoint/save_protocol.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint/internal/protocol_store.h"
#include "runtime/checkpoint/internal/selection.h"
#include "runtime/common/safe_file.h"
#include "runtime/common/status_macros.h"
#include "runtime/plan/digest.h"

namespace zerod::checkpoint {
namespace {

namespace fs = std::filesystem;
using internal::Absolute;
using internal::Await;
using internal::DecodeStatus;
using internal::EncodeStatus;
using internal::ForgetKeys;
using internal::HasManifest;
using internal::Log;
using internal::Named;
using internal::NextCall;
using internal::RankKeys;
using internal::RecordsByDirectory;
using internal::RememberKeys;
using internal::RootKind;
using internal::Scan;
using internal::SetFirst;
using internal::Skipped;
using internal::StepDir;
using nlohmann::json;

std::string EncodeRankFile(const RankFile& f) {
  json runs = json::array();
  for (const engine::ModelRun& r : f.runs) runs.push_back({r.offset, r.numel});
  return json{{"rank", f.rank},   {"name", f.name},         {"runs", runs},
              {"numel", f.numel}, {"extra", f.extra_bytes}, {"bytes", f.bytes},
              {"xxh3", f.xxh3},   {"blocks", f.block_xxh3}}
      .dump();
}

absl::StatusOr<RankFile> DecodeRankFile(const std::string& text, const std::string& key) {
  try {
    const json j = json::parse(text);
    RankFile f;
    f.rank = j.at("rank").get<int64_t>();
    f.name = j.at("name").get<std::string>();
    for (const json& r : j.at("runs"))
      f.runs.push_back({r.at(0).get<int64_t>(), r.at(1).get<int64_t>()});
    f.numel = j.at("numel").get<int64_t>();
    f.extra_bytes = j.at("extra").get<int64_t>();
    f.bytes = j.at("bytes").get<int64_t>();
    f.xxh3 = j.at("xxh3").get<uint64_t>();
    f.block_xxh3 = j.at("blocks").get<std::vector<uint64_t>>();
    return f;
  } catch (const json::exception& e) {
    return absl::InternalError(
        absl::StrCat("checkpoint: store key ", key, " is not a rank file entry (", e.what(), ")"));
  }
}

// Takes `dir`'s manifest away (the directory synced), so that what is left is recognisably
// partial: before its files are removed or replaced, or when the coordinator could not record it.
absl::Status RemoveManifest(const std::string& dir) {
  std::error_code ec;
  if (fs::remove(fs::path(dir) / kManifestName, ec); ec) {
    return absl::InternalError(
        absl::StrCat("checkpoint: cannot remove ", dir, "/", kManifestName, ": ", ec.message()));
  }
  return SyncDirectory(dir);
}

// The step directory `dir` as a directory of its own, made if missing (its root too): never a
// link put in its place, which every write would go through.
absl::Status MakeStepDirectory(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(fs::path(dir).parent_path(), ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("checkpoint: cannot create ", dir, ": ", ec.message()));
  }
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return FileError(errno, "cannot create the step directory", dir);
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return FileError(errno, "cannot stat", dir);
  if (S_ISLNK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint: ", dir, " is a symbolic link (to ", LinkTarget(dir),
        "): a save writes only into a step directory of its own, never through a link; remove "
        "the link"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint: ", dir, " is not a directory: remove it"));
  }
  return absl::OkStatus();
}

// Empties a step directory a save that did not finish left (another world's rank files, the
// temporary files of a rank killed while writing), so that it will hold this save's files alone.
absl::Status ClearPartial(const std::string& dir) {
  std::error_code ec;
  bool removed = false;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code remove_ec;
    fs::remove_all(it->path(), remove_ec);  // an entry that is a link: the link alone
    if (remove_ec) {
      return absl::InternalError(
          absl::StrCat("checkpoint: cannot remove ", it->path().string(),
                       " left by a save that did not finish: ", remove_ec.message()));
    }
    removed = true;
  }
  if (ec)
    return absl::InternalError(absl::StrCat("checkpoint: cannot list ", dir, ": ", ec.message()));
  return removed ? SyncDirectory(dir) : absl::OkStatus();
}

// Removes one step directory: the manifest first, so that a crash half-way leaves a directory
// recognisably partial, never a manifest over missing files.
absl::Status RemoveStepDirectory(const StepDir& d, Recorder* recorder,
                                 const CheckpointRecordInfo& template_record) {
  if (recorder != nullptr && d.record) {
    CheckpointRecordInfo removed = template_record;
    removed.step = d.step;
    removed.directory = d.dir;
    removed.state = RecordState::kRemoved;
    removed.bytes = 0;
    ZEROD_RETURN_IF_ERROR(recorder->Record(removed));
  }
  ZEROD_RETURN_IF_ERROR(RemoveManifest(d.dir));
  std::error_code ec;
  if (fs::remove_all(d.dir, ec); ec) {
    return absl::InternalError(
        absl::StrCat("checkpoint: cannot remove ", d.dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

// After step `step` is complete: keeps it and the keep_last - 1 newest complete ones before it,
// and removes every older partial one. Only directories of this job: with a recorder, those it
// has records of (another job sharing the root may be writing a partial one right now); without
// one (an in-memory snapshot, in a directory of its own), every one. Never a link.
absl::Status Prune(const std::string& root, int64_t step, int64_t keep_last, Recorder* recorder,
                   const CheckpointRecordInfo& template_record) {
  if (keep_last <= 0) return absl::OkStatus();
  ZEROD_ASSIGN_OR_RETURN(std::vector<StepDir> dirs, Scan(root, RootKind::kDurable, recorder));
  int64_t kept = 1;  // the new one
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->step >= step || it->skipped == Skipped::kNotThisJobs ||
        it->skipped == Skipped::kMissing || (recorder != nullptr && !it->record)) {
      continue;
    }
    if (it->skipped == Skipped::kNo && kept < keep_last) {
      ++kept;
      continue;
    }
    ZEROD_RETURN_IF_ERROR(RemoveStepDirectory(*it, recorder, template_record));
  }
  return absl::OkStatus();
}

// Whether `dir` holds nothing.
bool IsEmptyDirectory(const std::string& dir) {
  std::error_code ec;
  return fs::is_empty(dir, ec) && !ec;
}

// Rank 0, before any rank writes: refuses to overwrite a complete checkpoint of the same step (or
// one this job never recorded), records the save as started, and makes the directory, emptied of
// what a save of this job that did not finish left there. A partial directory the job has no
// record of is another's (a job sharing the root may be writing it right now): refused.
absl::Status Begin(const std::string& dir, Recorder* recorder, const CheckpointRecordInfo& saving) {
  struct stat st;
  const bool exists = ::lstat(dir.c_str(), &st) == 0;
  ZEROD_ASSIGN_OR_RETURN(auto records, RecordsByDirectory(recorder));
  auto r = records.find(dir);
  const bool ours = recorder == nullptr || r != records.end();
  if (exists && S_ISDIR(st.st_mode) && HasManifest(dir)) {
    if (!ours) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint: ", dir, " holds a checkpoint job ", recorder->job_id(),
          " never recorded (another job's, or copied in); a save does not replace it: move it "
          "away"));
    }
    if (r == records.end() || r->second.state == RecordState::kComplete) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint: step ", saving.step, " is already saved at ", dir,
                       " (complete); a step is saved once, and that checkpoint is kept as it is"));
    }
    // The manifest of a save the coordinator never recorded complete (or a checkpoint set aside
    // and put back): not a checkpoint to keep; it goes before any rank file is replaced.
    ZEROD_RETURN_IF_ERROR(RemoveManifest(dir));
  }
  // A link in the step directory's place is refused before anything is recorded.
  if (exists && !S_ISDIR(st.st_mode)) ZEROD_RETURN_IF_ERROR(MakeStepDirectory(dir));
  if (exists && S_ISDIR(st.st_mode) && !ours && !IsEmptyDirectory(dir)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint: ", dir, " holds files of a save job ", recorder->job_id(),
        " never recorded (another job sharing the root may be writing it); a save does not "
        "empty it: move it away"));
  }
  if (recorder != nullptr) ZEROD_RETURN_IF_ERROR(recorder->Record(saving));
  ZEROD_RETURN_IF_ERROR(MakeStepDirectory(dir));
  ZEROD_RETURN_IF_ERROR(ClearPartial(dir));
  // The new directory's entry reaches the disk before any older checkpoint can be removed.
  return SyncDirectory(fs::path(dir).parent_path().string());
}

// Rank 0, once every rank's entry is in: the manifest, the record, keep_last.
absl::StatusOr<int64_t> Finish(engine::ZeroEngine& engine, const std::string& root,
                               const std::string& dir, const SaveOptions& options,
                               std::vector<RankFile> files, Recorder* recorder,
                               CheckpointRecordInfo record) {
  const plan::ShardPlan& plan = engine.plan();
  Manifest m;
  m.job_id = options.job_id;
  m.counters = engine.counters();
  m.step = m.counters.steps_taken;
  m.world_size = plan.world_size();
  m.stage = plan.stage();
  m.param_dtype = plan.options().param_dtype;
  m.grad_dtype = plan.options().grad_dtype;
  m.layout = plan.tensors();
  m.layout_digest = plan::DigestHex(plan::LayoutDigest(m.layout));
  m.plan_digest = plan.DigestHex();
  m.total_numel = plan.total_numel();
  m.files = std::move(files);
  m.user = options.user;
  m.created_unix_ms = absl::ToUnixMillis(absl::Now());
  m.recorded = recorder != nullptr;
  int64_t bytes = 0;
  for (const RankFile& f : m.files) bytes += f.bytes;
  ZEROD_RETURN_IF_ERROR(WriteManifest(dir, m));
  if (recorder != nullptr) {
    // The record names the manifest as written (read back: what a loader will read).
    absl::StatusOr<Manifest> written = ReadManifest(dir);
    if (!written.ok()) {
      (void)RemoveManifest(dir);
      return written.status();
    }
    record.state = RecordState::kComplete;
    record.bytes = bytes;
    record.manifest_xxh3 = written->manifest_xxh3;
    if (absl::Status recorded = recorder->Record(record); !recorded.ok()) {
      // Complete on disk but not on the coordinator's side: take the manifest back, so that no
      // reader counts it complete while the record says saving (a load would refuse it).
      (void)RemoveManifest(dir);
      return recorded;
    }
  }
  // The new checkpoint is complete: an error removing old ones loses nothing, so it is logged,
  // not returned.
  if (absl::Status pruned = Prune(root, m.step, options.keep_last, recorder, record);
      !pruned.ok()) {
    Log().warn("checkpoint: step {} is saved, but removing older checkpoints failed: {}", m.step,
               pruned.ToString());
  }
  return bytes;
}

}  // namespace

absl::StatusOr<SavedCheckpoint> Save(engine::ZeroEngine& engine, comm::Store& store,
                                     Recorder* recorder, const SaveOptions& options) {
  if (!options.record) recorder = nullptr;  // an in-memory snapshot: not the coordinator's to list
  const absl::Time deadline = absl::Now() + options.timeout;
  const int64_t rank = engine.rank();
  const int64_t world = engine.plan().world_size();
  const int64_t step = engine.step();
  if (options.root.empty()) return absl::InvalidArgumentError("checkpoint: no root directory");
  if (options.keep_last < 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: keep_last is ", options.keep_last,
                                                   " (expected 0: keep every "
                                                   "checkpoint, or a positive count)"));
  }
  const std::string root = Absolute(options.root);
  const std::string dir = Absolute(StepDirectory(root, step));  // as records are compared
  ZEROD_ASSIGN_OR_RETURN(const int64_t call, NextCall(store, rank));
  const std::string prefix = absl::StrCat("ckpt/", step, "/", call, "/");
  const std::string done_key = prefix + "done";
  const std::string context =
      absl::StrCat(options.job_id.empty() ? "" : absl::StrCat("job ", options.job_id, ": "),
                   "checkpoint step ", step, ": ");
  // The outcome every rank returns: what `done` holds.
  auto outcome = [&](const std::string& value) -> absl::StatusOr<SavedCheckpoint> {
    ZEROD_ASSIGN_OR_RETURN(std::string payload, DecodeStatus(value, done_key));
    int64_t bytes = 0;
    if (!absl::SimpleAtoi(payload, &bytes)) {
      return absl::InternalError(absl::StrCat(context, "store key ", done_key, " holds '", payload,
                                              "', not a byte count"));
    }
    return SavedCheckpoint{step, dir, bytes};
  };
  auto fail = [&](const absl::Status& why) -> absl::StatusOr<SavedCheckpoint> {
    ZEROD_ASSIGN_OR_RETURN(std::string held, SetFirst(store, done_key, EncodeStatus(why)));
    return outcome(held);
  };

  CheckpointRecordInfo record{step, dir, world, engine.plan().stage(), RecordState::kSaving, 0};
  // 1. Rank 0 says whether the save may go ahead.
  if (rank == 0) {
    std::vector<std::string> keys = RankKeys(prefix + "rank/", world);
    keys.push_back(prefix + "start");
    keys.push_back(done_key);
    ZEROD_RETURN_IF_ERROR(RememberKeys(store, call, keys));
    absl::Status begun = Begin(dir, recorder, record);
    if (!begun.ok()) begun = Named(begun, context);
    ZEROD_RETURN_IF_ERROR(store.Set(prefix + "start", EncodeStatus(begun)));
    if (!begun.ok()) return fail(begun);
  } else {
    ZEROD_ASSIGN_OR_RETURN(
        std::string start,
        Await(store, prefix + "start", deadline, "rank 0 did not start the save", options.timeout));
    ZEROD_RETURN_IF_ERROR(DecodeStatus(start, prefix + "start").status());
  }

  // 2. Every rank writes its file and publishes its entry or its error.
  absl::StatusOr<RankFile> file = [&]() -> absl::StatusOr<RankFile> {
    ZEROD_RETURN_IF_ERROR(MakeStepDirectory(dir));
    return WriteRankFile(dir, engine, options.extra);
  }();
  if (!file.ok()) {
    const absl::Status why = Named(file.status(), absl::StrCat(context, "rank ", rank, ": "));
    ZEROD_RETURN_IF_ERROR(store.Set(absl::StrCat(prefix, "rank/", rank), EncodeStatus(why)));
    return fail(why);
  }
  ZEROD_RETURN_IF_ERROR(store.Set(absl::StrCat(prefix, "rank/", rank),
                                  EncodeStatus(absl::OkStatus(), EncodeRankFile(*file))));

  // 4. The others wait for rank 0's outcome (or the first rank's error).
  if (rank != 0) {
    ZEROD_ASSIGN_OR_RETURN(std::string done,
                           Await(store, done_key, absl::Now() + options.timeout,
                                 "rank 0 did not complete the save", options.timeout));
    return outcome(done);
  }

  // 3. Rank 0 collects every entry, completes the checkpoint and publishes the outcome. The
  // waits are counted from the end of its own write, not from the start of the save: a file
  // that takes longer than the timeout to write is no reason to fail.
  std::vector<RankFile> files{*std::move(file)};
  const absl::Time collect_deadline = absl::Now() + options.timeout;
  for (int64_t r = 1; r < world; ++r) {
    const std::string key = absl::StrCat(prefix, "rank/", r);
    absl::StatusOr<std::string> entry =
        Await(store, key, collect_deadline, absl::StrCat("rank ", r, " did not report its file"),
              options.timeout);
    // A rank's own error already names it; a timeout names the rank waited for.
    if (!entry.ok()) return fail(Named(entry.status(), context));
    absl::StatusOr<std::string> payload = DecodeStatus(*entry, key);
    if (!payload.ok()) return fail(payload.status());
    absl::StatusOr<RankFile> other = DecodeRankFile(*payload, key);
    if (!other.ok()) return fail(other.status());
    files.push_back(*std::move(other));
  }
  // Every rank reached this call: the previous call's keys are read by nobody any more.
  ForgetKeys(store, call - 1);
  absl::StatusOr<int64_t> bytes =
      Finish(engine, root, dir, options, std::move(files), recorder, record);
  if (!bytes.ok()) return fail(Named(bytes.status(), context));
  ZEROD_ASSIGN_OR_RETURN(
      std::string held,
      SetFirst(store, done_key, EncodeStatus(absl::OkStatus(), absl::StrCat(*bytes))));
  return outcome(held);
}

}  // namespace zerod::checkpoint
