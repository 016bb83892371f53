#include "runtime/checkpoint/save_protocol.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint/internal/file_io.h"
#include "runtime/common/status_macros.h"
#include "runtime/plan/digest.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace zerod::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

spdlog::logger& Log() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    std::shared_ptr<spdlog::logger> found = spdlog::get("checkpoint");
    return found != nullptr ? found : spdlog::stderr_color_mt("checkpoint");
  }();
  return *logger;
}

// ---- Values in the store: a status, or OK with a payload. ----

std::string EncodeStatus(const absl::Status& status, const std::string& payload = "") {
  if (status.ok()) return "OK\n" + payload;
  return absl::StrCat("ERR ", static_cast<int>(status.code()), "\n", status.message());
}

// The payload of an OK value, or the error it carries.
absl::StatusOr<std::string> DecodeStatus(const std::string& value, const std::string& key) {
  const size_t newline = value.find('\n');
  const std::string head = value.substr(0, newline);
  const std::string rest = newline == std::string::npos ? "" : value.substr(newline + 1);
  if (head == "OK") return rest;
  int code = 0;
  if (absl::StartsWith(head, "ERR ") && absl::SimpleAtoi(head.substr(4), &code) && code > 0 &&
      code <= 16) {
    return absl::Status(static_cast<absl::StatusCode>(code), rest);
  }
  return absl::InternalError(absl::StrCat("checkpoint: store key ", key, " holds '",
                                          value.substr(0, 64), "', not a status"));
}

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

// Which of this rank's Save/Load calls this is (1, 2, ...): the same on every rank, since every
// rank makes the same calls in the same order.
absl::StatusOr<int64_t> NextCall(comm::Store& store, int64_t rank) {
  return store.Add(absl::StrCat("ckpt/calls/", rank), 1);
}

// The store keys of one Save or Load call, listed by rank 0 under `ckpt/keys/<call>`, so that a
// later call can delete them: a job that snapshots every step would otherwise fill its store quota
// (world + 2 keys a save).
absl::Status RememberKeys(comm::Store& store, int64_t call, const std::vector<std::string>& keys) {
  return store.Set(absl::StrCat("ckpt/keys/", call), absl::StrJoin(keys, "\n"));
}

// Deletes call `call`'s keys. Rank 0 calls it for the previous call once every rank has reached
// this one's rendezvous, so nobody still waits on them. Best effort: a key left costs a little
// of the quota, a failed delete is no reason to fail a save.
void ForgetKeys(comm::Store& store, int64_t call) {
  const std::string list_key = absl::StrCat("ckpt/keys/", call);
  absl::StatusOr<std::string> list = store.Get(list_key, absl::ZeroDuration());
  if (!list.ok()) return;
  for (absl::string_view key : absl::StrSplit(*list, '\n', absl::SkipEmpty())) {
    (void)store.Delete(std::string(key));
  }
  (void)store.Delete(list_key);
}

std::vector<std::string> RankKeys(const std::string& prefix, int64_t world) {
  std::vector<std::string> keys;
  for (int64_t r = 0; r < world; ++r) keys.push_back(absl::StrCat(prefix, r));
  return keys;
}

absl::Duration Remaining(absl::Time deadline) {
  return std::max(absl::ZeroDuration(), deadline - absl::Now());
}

// The value at `key`, waited for until `deadline`; a timeout says who was waited for.
absl::StatusOr<std::string> Await(comm::Store& store, const std::string& key, absl::Time deadline,
                                  const std::string& waiting_for, absl::Duration timeout) {
  absl::StatusOr<std::string> value = store.Get(key, Remaining(deadline));
  if (value.ok()) return value;
  if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::DeadlineExceededError(absl::StrCat("checkpoint: ", waiting_for, " within ",
                                                    absl::FormatDuration(timeout), " (key ", key,
                                                    ")"));
  }
  return value.status();
}

// Sets `key` to `value` unless someone set it first; returns what it holds afterwards.
absl::StatusOr<std::string> SetFirst(comm::Store& store, const std::string& key,
                                     const std::string& value) {
  return store.CompareSet(key, std::nullopt, value);
}

std::string Absolute(const std::string& path) {
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec);
  return (ec ? fs::path(path) : p).lexically_normal().string();
}

bool HasManifest(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kManifestName, ec);
}

// Takes `dir`'s manifest away (the directory synced), so that what is left is recognisably
// partial: before its files are removed or replaced, or when the coordinator could not record it.
absl::Status RemoveManifest(const std::string& dir) {
  std::error_code ec;
  if (fs::remove(fs::path(dir) / kManifestName, ec); ec) {
    return absl::InternalError(
        absl::StrCat("checkpoint: cannot remove ", dir, "/", kManifestName, ": ", ec.message()));
  }
  return internal::SyncDirectory(dir);
}

const char* StateName(RecordState s) {
  switch (s) {
    case RecordState::kSaving:
      return "saving";
    case RecordState::kComplete:
      return "complete";
    case RecordState::kRemoved:
      return "removed";
  }
  return "?";
}

// The coordinator's records by directory (empty without a recorder).
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

struct StepDir {
  int64_t step = 0;
  std::string dir;
  std::string partial_because;  // empty: complete
  bool recorded = false;        // the coordinator has a record of it
};

// The step directories under `root`, oldest first, each complete or partial with the reason.
// A directory without a record (saved by another job) counts by its manifest alone.
absl::StatusOr<std::vector<StepDir>> Scan(const std::string& root, Recorder* recorder) {
  std::vector<StepDir> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  ZEROD_ASSIGN_OR_RETURN(auto records, RecordsByDirectory(recorder));
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = StepOfDirectoryName(it->path().filename().string());
    // A link (an operator's "best" pointing at a checkpoint) is not one of ours to count or
    // remove: removing through it would break the checkpoint it points at.
    if (step < 0 || it->is_symlink(ec) || !it->is_directory(ec)) continue;
    StepDir d{step, Absolute(it->path().string()), "", false};
    auto record = records.find(d.dir);
    d.recorded = record != records.end();
    if (!HasManifest(d.dir)) {
      d.partial_because = "rank files but no manifest.json";
    } else if (d.recorded && record->second.state != RecordState::kComplete) {
      d.partial_because =
          absl::StrCat("the coordinator's record says ", StateName(record->second.state));
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

std::string Describe(const std::vector<StepDir>& partial) {
  std::vector<std::string> parts;
  for (const StepDir& d : partial)
    parts.push_back(absl::StrCat(d.dir, " (", d.partial_because, ")"));
  return absl::StrJoin(parts, ", ");
}

// What Load loads: a directory, or nothing (a root with no complete checkpoint).
struct Choice {
  std::string dir;  // empty: nothing to load
  std::string nothing_because;
};

// Rank 0's choice with its manifest, read once: what it publishes and then loads.
struct ChosenManifest {
  Choice choice;
  Manifest manifest;  // of choice.dir, when there is one
};

absl::StatusOr<Choice> Choose(const std::string& path, Recorder* recorder) {
  const std::string abs = Absolute(path);
  std::error_code ec;
  const bool exists = fs::exists(abs, ec);
  if (exists && !fs::is_directory(abs, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint: ", abs,
                     " is not a directory (expected a checkpoint root or "
                     "a step directory)"));
  }
  const bool is_checkpoint =
      HasManifest(abs) || StepOfDirectoryName(fs::path(abs).filename().string()) >= 0;
  if (is_checkpoint) {
    // One directory asked for by name: it loads or it is an error, never something else.
    if (!exists) return absl::NotFoundError(absl::StrCat("checkpoint: ", abs, " does not exist"));
    ZEROD_ASSIGN_OR_RETURN(auto records, RecordsByDirectory(recorder));
    if (auto r = records.find(abs);
        r != records.end() && r->second.state != RecordState::kComplete) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint: ", abs, " is partial: the coordinator's record says ",
                       StateName(r->second.state), " (its save did not finish)"));
    }
    return Choice{abs, ""};
  }
  ZEROD_ASSIGN_OR_RETURN(std::vector<StepDir> dirs, Scan(abs, recorder));
  std::vector<StepDir> partial;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->partial_because.empty()) {
      if (!partial.empty()) {
        Log().warn("checkpoint: loading {}, skipping newer partial checkpoints: {}", it->dir,
                   Describe(partial));
      }
      return Choice{it->dir, ""};
    }
    partial.push_back(*it);
  }
  return Choice{"", absl::StrCat("no complete checkpoint under ", abs,
                                 partial.empty() ? "" : " (skipped partial: ", Describe(partial),
                                 partial.empty() ? "" : ")")};
}

// Removes one step directory: the manifest first, so that a crash half-way leaves a directory
// recognisably partial, never a manifest over missing files.
absl::Status RemoveStepDirectory(const StepDir& d, Recorder* recorder,
                                 const CheckpointRecordInfo& template_record) {
  if (recorder != nullptr && d.recorded) {
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
// one (an in-memory snapshot, in a directory of its own), every one.
absl::Status Prune(const std::string& root, int64_t step, int64_t keep_last, Recorder* recorder,
                   const CheckpointRecordInfo& template_record) {
  if (keep_last <= 0) return absl::OkStatus();
  ZEROD_ASSIGN_OR_RETURN(std::vector<StepDir> dirs, Scan(root, recorder));
  int64_t kept = 1;  // the new one
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->step >= step || (recorder != nullptr && !it->recorded)) continue;
    if (it->partial_because.empty() && kept < keep_last) {
      ++kept;
      continue;
    }
    ZEROD_RETURN_IF_ERROR(RemoveStepDirectory(*it, recorder, template_record));
  }
  return absl::OkStatus();
}

// Rank 0, before any rank writes: refuses to overwrite a complete checkpoint of the same step,
// records the save as started, and creates the directory.
absl::Status Begin(const std::string& dir, Recorder* recorder, const CheckpointRecordInfo& saving) {
  if (HasManifest(dir)) {
    ZEROD_ASSIGN_OR_RETURN(auto records, RecordsByDirectory(recorder));
    auto r = records.find(dir);
    if (r == records.end() || r->second.state == RecordState::kComplete) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint: step ", saving.step, " is already saved at ", dir,
                       " (complete); a step is saved once, and that checkpoint is kept as it is"));
    }
    // The manifest of a save the coordinator never recorded complete: not a checkpoint; it goes
    // before any rank file is replaced.
    ZEROD_RETURN_IF_ERROR(RemoveManifest(dir));
  }
  if (recorder != nullptr) ZEROD_RETURN_IF_ERROR(recorder->Record(saving));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("checkpoint: cannot create ", dir, ": ", ec.message()));
  }
  // The new directory's entry reaches the disk before any older checkpoint can be removed.
  return internal::SyncDirectory(fs::path(dir).parent_path().string());
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
  int64_t bytes = 0;
  for (const RankFile& f : m.files) bytes += f.bytes;
  ZEROD_RETURN_IF_ERROR(WriteManifest(dir, m));
  if (recorder != nullptr) {
    record.state = RecordState::kComplete;
    record.bytes = bytes;
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

absl::Status Named(const absl::Status& s, const std::string& context) {
  return absl::Status(s.code(), absl::StrCat(context, s.message()));
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
  const std::string dir = StepDirectory(root, step);
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
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
    }
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

absl::StatusOr<std::string> LatestComplete(const std::string& root, Recorder* recorder) {
  ZEROD_ASSIGN_OR_RETURN(std::vector<StepDir> dirs, Scan(Absolute(root), recorder));
  std::vector<StepDir> partial;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->partial_because.empty()) return it->dir;
    partial.push_back(*it);
  }
  return absl::NotFoundError(absl::StrCat(
      "checkpoint: no complete checkpoint under ", Absolute(root),
      partial.empty() ? "" : " (skipped partial: ", Describe(partial), partial.empty() ? "" : ")"));
}

namespace {

// Publishes this rank's verdict under `prefix`<rank> and waits for every rank's: the first
// failure (its rank named) on every rank, or OK once all succeeded.
absl::Status Agree(comm::Store& store, const std::string& prefix, int64_t rank, int64_t world,
                   absl::Status mine, absl::Time deadline, absl::Duration timeout,
                   const std::string& what) {
  if (!mine.ok() && rank != 0) mine = Named(mine, absl::StrCat("rank ", rank, ": "));
  ZEROD_RETURN_IF_ERROR(store.Set(absl::StrCat(prefix, rank), EncodeStatus(mine)));
  for (int64_t r = 0; r < world; ++r) {
    const std::string rank_key = absl::StrCat(prefix, r);
    ZEROD_ASSIGN_OR_RETURN(
        std::string verdict,
        Await(store, rank_key, deadline, absl::StrCat("rank ", r, " did not ", what), timeout));
    ZEROD_RETURN_IF_ERROR(DecodeStatus(verdict, rank_key).status());
  }
  return absl::OkStatus();
}

// Load's work; `nothing` says why when there is nothing to load.
absl::StatusOr<std::optional<LoadedCheckpoint>> LoadChosen(
    engine::ZeroEngine& engine, comm::Store& store, const std::string& path, Recorder* recorder,
    absl::Duration timeout, std::string& nothing) {
  const absl::Time deadline = absl::Now() + timeout;
  const int64_t rank = engine.rank();
  const int64_t world = engine.plan().world_size();
  ZEROD_ASSIGN_OR_RETURN(const int64_t call, NextCall(store, rank));
  const std::string key = absl::StrCat("ckpt/load/", call);

  // Rank 0 chooses: "D <step> <created ms>\n<dir>", "N\n<why nothing>", or an error.
  std::string published;
  std::optional<Manifest> chosen_manifest;  // rank 0's, read once
  if (rank == 0) {
    absl::StatusOr<ChosenManifest> chosen = [&]() -> absl::StatusOr<ChosenManifest> {
      ZEROD_ASSIGN_OR_RETURN(Choice choice, Choose(path, recorder));
      if (choice.dir.empty()) return ChosenManifest{std::move(choice), Manifest{}};
      ZEROD_ASSIGN_OR_RETURN(Manifest manifest, ReadManifest(choice.dir));
      return ChosenManifest{std::move(choice), std::move(manifest)};
    }();
    if (!chosen.ok()) {
      published = EncodeStatus(chosen.status());
    } else if (chosen->choice.dir.empty()) {
      published = EncodeStatus(absl::OkStatus(), "N\n" + chosen->choice.nothing_because);
    } else {
      const Manifest& m = chosen->manifest;
      published = EncodeStatus(absl::OkStatus(), absl::StrCat("D ", m.step, " ", m.created_unix_ms,
                                                              "\n", chosen->choice.dir));
      chosen_manifest = std::move(chosen->manifest);
    }
    std::vector<std::string> keys = RankKeys(key + "/rank/", world);
    for (std::string& k : RankKeys(key + "/read/", world)) keys.push_back(std::move(k));
    keys.push_back(key);
    ZEROD_RETURN_IF_ERROR(RememberKeys(store, call, keys));
    ZEROD_RETURN_IF_ERROR(store.Set(key, published));
  } else {
    ZEROD_ASSIGN_OR_RETURN(published, Await(store, key, deadline,
                                            "rank 0 did not choose a checkpoint to load", timeout));
  }
  ZEROD_ASSIGN_OR_RETURN(const std::string choice, DecodeStatus(published, key));
  const size_t newline = choice.find('\n');
  const std::string head = choice.substr(0, newline);
  const std::string rest = newline == std::string::npos ? "" : choice.substr(newline + 1);
  if (head == "N") {
    nothing = rest;
    return std::nullopt;
  }
  const std::vector<std::string> fields = absl::StrSplit(head, ' ');
  int64_t step = 0, created_ms = 0;
  if (fields.size() != 3 || fields[0] != "D" || !absl::SimpleAtoi(fields[1], &step) ||
      !absl::SimpleAtoi(fields[2], &created_ms)) {
    return absl::InternalError(absl::StrCat("checkpoint: store key ", key, " holds '", choice,
                                            "', not a choice of checkpoint"));
  }
  const std::string dir = rest;

  // Every rank checks that it sees rank 0's checkpoint (a directory every rank shares), and all
  // learn each other's verdict before Restore's collective, so nobody waits in it for a rank
  // that gave up.
  absl::StatusOr<Manifest> manifest =
      chosen_manifest ? absl::StatusOr<Manifest>(*std::move(chosen_manifest)) : ReadManifest(dir);
  absl::Status mine = manifest.status();
  if (mine.ok() && (manifest->step != step || manifest->created_unix_ms != created_ms)) {
    mine = absl::FailedPreconditionError(absl::StrCat(
        "checkpoint: rank ", rank, " reads another checkpoint at ", dir, " (step ", manifest->step,
        ", saved at ", manifest->created_unix_ms, " ms) than rank 0 (step ", step, ", saved at ",
        created_ms, " ms): is the directory on a filesystem every rank shares?"));
  }
  if (mine.ok()) mine = CheckLayout(*manifest, engine.plan().tensors(), dir);
  ZEROD_RETURN_IF_ERROR(Agree(store, absl::StrCat(key, "/rank/"), rank, world, mine, deadline,
                              timeout, absl::StrCat("check ", dir)));
  // Every rank reached this call: the previous call's keys are read by nobody any more.
  if (rank == 0) ForgetKeys(store, call - 1);

  // Each rank reads its own part; a damaged block only one rank reads fails that rank, so every
  // rank again learns every verdict before FinishRestore's collective (stages 1-2 all-gather the
  // parameters), rather than wait in it for a rank that gave up.
  LoadedCheckpoint loaded;
  loaded.step = step;
  loaded.directory = dir;
  const absl::Time read_start = absl::Now();
  absl::Status read = LoadState(dir, *manifest, engine);
  loaded.read_time = absl::Now() - read_start;
  if (read.ok()) {
    absl::StatusOr<std::string> extra = ReadExtra(dir, *manifest, rank);
    read = extra.status();
    if (extra.ok()) loaded.extra = *std::move(extra);
  }
  ZEROD_RETURN_IF_ERROR(Agree(store, absl::StrCat(key, "/read/"), rank, world, read, deadline,
                              timeout, absl::StrCat("read ", dir)));
  ZEROD_RETURN_IF_ERROR(engine.FinishRestore(manifest->counters));
  loaded.manifest = *std::move(manifest);
  return loaded;
}

}  // namespace

absl::StatusOr<std::optional<LoadedCheckpoint>> LoadIfAny(engine::ZeroEngine& engine,
                                                          comm::Store& store,
                                                          const std::string& path,
                                                          Recorder* recorder,
                                                          absl::Duration timeout) {
  std::string nothing;
  return LoadChosen(engine, store, path, recorder, timeout, nothing);
}

absl::StatusOr<std::optional<LoadedCheckpoint>> LoadNewestIfAny(
    engine::ZeroEngine& engine, comm::Store& store, const std::vector<std::string>& roots,
    Recorder* recorder, absl::Duration timeout) {
  if (roots.empty()) return absl::InvalidArgumentError("checkpoint: no roots to load from");
  // Only rank 0's path is read (it chooses for everyone): the others pass the first root.
  std::string path = roots.front();
  if (engine.rank() == 0) {
    int64_t newest = -1;
    for (const std::string& root : roots) {
      absl::StatusOr<std::string> dir = LatestComplete(root, recorder);
      if (absl::IsNotFound(dir.status())) continue;
      ZEROD_RETURN_IF_ERROR(dir.status());
      const int64_t step = StepOfDirectoryName(fs::path(*dir).filename().string());
      if (step > newest) {
        newest = step;
        path = *dir;
      }
    }
  }
  std::string nothing;
  return LoadChosen(engine, store, path, recorder, timeout, nothing);
}

absl::StatusOr<LoadedCheckpoint> Load(engine::ZeroEngine& engine, comm::Store& store,
                                      const std::string& path, Recorder* recorder,
                                      absl::Duration timeout) {
  std::string nothing;
  ZEROD_ASSIGN_OR_RETURN(std::optional<LoadedCheckpoint> loaded,
                         LoadChosen(engine, store, path, recorder, timeout, nothing));
  if (!loaded.has_value()) return absl::NotFoundError(absl::StrCat("checkpoint: ", nothing));
  return *std::move(loaded);
}

}  // namespace zerod::checkpoint
