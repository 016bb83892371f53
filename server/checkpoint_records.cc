#include "server/checkpoint_records.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/join_admission.h"
#include "server/logging.h"

namespace zerod::server {
namespace {

constexpr char kCheckpointsPrefix[] = "checkpoints/";

std::string StateName(v1::CheckpointState state) {
  switch (state) {
    case v1::CHECKPOINT_SAVING:
      return "saving";
    case v1::CHECKPOINT_COMPLETE:
      return "complete";
    case v1::CHECKPOINT_REMOVED:
      return "removed";
    case v1::CHECKPOINT_SET_ASIDE:
      return "set aside";
    default:
      return absl::StrCat("state ", static_cast<int>(state));
  }
}

// "job J: checkpoint at step N: ", the start of every message about one record.
std::string About(const std::string& job_id, int64_t step) {
  return absl::StrCat("job ", ShownJobId(job_id), ": checkpoint at step ", step, ": ");
}

// A directory as messages show it: a caller's path may be 4 KiB.
std::string ShownDirectory(const std::string& directory) {
  return absl::StrCat("'", ShownKey(directory), "'");
}

// The states a record may hold (not UNSPECIFIED, not a number this build does not know).
bool KnownState(v1::CheckpointState state) {
  return state == v1::CHECKPOINT_SAVING || state == v1::CHECKPOINT_COMPLETE ||
         state == v1::CHECKPOINT_REMOVED || state == v1::CHECKPOINT_SET_ASIDE;
}

bool SameShape(const v1::CheckpointRecord& a, const v1::CheckpointRecord& b) {
  return a.directory() == b.directory() && a.world_size() == b.world_size() &&
         a.stage() == b.stage();
}

}  // namespace

std::string CheckpointsPrefix(const std::string& job_id) {
  return absl::StrCat(kCheckpointsPrefix, job_id, "/");
}

std::string CheckpointKey(const std::string& job_id, int64_t step) {
  // Fixed width, so that key order is step order (steps are never negative).
  return absl::StrFormat("%s%020d", CheckpointsPrefix(job_id), step);
}

absl::Status CheckCheckpointArgs(const std::string& job_id, const v1::CheckpointRecord& r,
                                 const CheckpointLimits& limits) {
  if (absl::Status s = ValidateJobId(job_id, limits.max_job_id_bytes); !s.ok()) return s;
  if (!r.job_id().empty() && r.job_id() != job_id) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", job_id, ": the record names job '", ShownJobId(r.job_id()), "'"));
  }
  const std::string about = About(job_id, r.step());
  if (r.step() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(about, "the step is negative"));
  }
  if (r.directory().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(about, "the directory is empty"));
  }
  if (r.directory().size() > kMaxCheckpointDirectoryBytes) {
    return absl::InvalidArgumentError(absl::StrCat(about, "the directory is ", r.directory().size(),
                                                   " bytes, more than ",
                                                   kMaxCheckpointDirectoryBytes));
  }
  if (r.directory().find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(about, "the directory ", ShownDirectory(r.directory()), " holds a NUL byte"));
  }
  if (r.world_size() < 1 || r.world_size() > limits.max_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(about, "world size ", r.world_size(),
                                                   " is outside [1, ", limits.max_world_size,
                                                   "] (--max-world-size)"));
  }
  if (r.stage() < 0 || r.stage() > 3) {
    return absl::InvalidArgumentError(absl::StrCat(about, "stage ", r.stage(), " is not 0-3"));
  }
  if (!KnownState(r.state())) {
    return absl::InvalidArgumentError(absl::StrCat(
        about, StateName(r.state()), " is not one of saving, complete, removed, set aside"));
  }
  if (r.bytes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(about, "bytes ", r.bytes(), " is negative"));
  }
  return absl::OkStatus();
}

std::optional<v1::CheckpointRecord> DecodeCheckpoint(const std::string& job_id,
                                                     const KeyValue& stored, std::string* problem) {
  const std::string prefix = CheckpointsPrefix(job_id);
  int64_t step = -1;
  if (!absl::StartsWith(stored.key, prefix) ||
      !absl::SimpleAtoi(stored.key.substr(prefix.size()), &step) || step < 0) {
    *problem = "its key is not checkpoints/<job>/<step>";
    return std::nullopt;
  }
  v1::CheckpointRecord r;
  if (!r.ParseFromString(stored.value)) {
    *problem = "it does not parse";
    return std::nullopt;
  }
  if (r.job_id() != job_id || r.step() != step) {
    *problem = absl::StrCat("it names job '", ShownJobId(r.job_id()), "' step ", r.step());
    return std::nullopt;
  }
  if (!KnownState(r.state())) {
    *problem = absl::StrCat("its ", StateName(r.state()), " is unknown");
    return std::nullopt;
  }
  return r;
}

CheckpointDecision DecideCheckpoint(const std::string& job_id, const v1::CheckpointRecord& request,
                                    const std::vector<KeyValue>& stored, absl::Time now,
                                    const CheckpointLimits& limits) {
  const std::string about = About(job_id, request.step());
  const std::string key = CheckpointKey(job_id, request.step());
  const int64_t now_ms = absl::ToUnixMillis(now);
  std::optional<v1::CheckpointRecord> old;
  bool key_taken = false;
  for (const KeyValue& kv : stored) {
    if (kv.key != key) continue;
    key_taken = true;
    std::string problem;
    // One that does not decode is replaced by a new save; anything else needs a record to follow.
    old = DecodeCheckpoint(job_id, kv, &problem);
  }

  auto write = [&](v1::CheckpointRecord record) {
    CheckpointDecision d;
    d.ops.push_back(KvOp::Put(key, record.SerializeAsString()));
    d.record = std::move(record);
    return d;
  };
  auto unchanged = [&]() { return CheckpointDecision{*old, {}}; };
  auto refuse = [&](const std::string& why) {
    return CheckpointDecision{absl::FailedPreconditionError(absl::StrCat(about, why)), {}};
  };
  auto fresh_save = [&]() {
    v1::CheckpointRecord r = request;
    r.set_job_id(job_id);
    r.set_created_unix_ms(now_ms);
    r.set_completed_unix_ms(0);
    return r;
  };

  if (!old) {
    if (request.state() != v1::CHECKPOINT_SAVING) {
      return refuse(absl::StrCat("none is recorded, so it cannot be recorded ",
                                 StateName(request.state()), "; record it saving first"));
    }
    // A new step: room for it, made by dropping the oldest removed records when the job is full.
    std::vector<std::pair<int64_t, std::string>> removed;  // step, key
    for (const KeyValue& kv : stored) {
      std::string problem;
      std::optional<v1::CheckpointRecord> r = DecodeCheckpoint(job_id, kv, &problem);
      if (r && r->state() == v1::CHECKPOINT_REMOVED) removed.emplace_back(r->step(), kv.key);
    }
    std::sort(removed.begin(), removed.end());
    const int64_t excess =
        key_taken ? 0 : static_cast<int64_t>(stored.size()) + 1 - limits.max_records_per_job;
    if (excess > static_cast<int64_t>(removed.size())) {
      return CheckpointDecision{
          absl::ResourceExhaustedError(absl::StrCat(
              about, "the job holds ", stored.size(), " checkpoint records, the most it may, and ",
              removed.size(), " of them removed; remove old checkpoints first")),
          {}};
    }
    CheckpointDecision d = write(fresh_save());
    for (int64_t i = 0; i < excess; ++i)
      d.ops.insert(d.ops.begin(), KvOp::Delete(removed[i].second));
    return d;
  }

  const bool same_directory = old->directory() == request.directory();
  const std::string recorded_in =
      absl::StrCat("it is recorded ", StateName(old->state()), " in ",
                   ShownDirectory(old->directory()), ", not ", ShownDirectory(request.directory()));
  switch (request.state()) {
    case v1::CHECKPOINT_SAVING:
      if (old->state() == v1::CHECKPOINT_COMPLETE) {
        // A step is saved once: writing it again, even in place, could leave it half rewritten
        // while its record says complete.
        return refuse(absl::StrCat("it is recorded complete in ", ShownDirectory(old->directory()),
                                   "; a complete checkpoint is not saved again"));
      }
      if (old->state() == v1::CHECKPOINT_SAVING && SameShape(*old, request)) return unchanged();
      // A save that was abandoned (or removed) starts afresh at this step.
      return write(fresh_save());
    case v1::CHECKPOINT_COMPLETE: {
      if (old->state() == v1::CHECKPOINT_REMOVED || old->state() == v1::CHECKPOINT_SET_ASIDE) {
        return refuse(absl::StrCat("it was ", StateName(old->state()), " (",
                                   ShownDirectory(old->directory()), "); record a new save first"));
      }
      if (!same_directory) return refuse(recorded_in);
      if (old->state() == v1::CHECKPOINT_COMPLETE) return unchanged();
      if (old->world_size() != request.world_size() || old->stage() != request.stage()) {
        return refuse(absl::StrCat("it is being saved at world size ", old->world_size(),
                                   " and stage ", old->stage(), ", not world size ",
                                   request.world_size(), " and stage ", request.stage()));
      }
      v1::CheckpointRecord r = *old;
      r.set_state(v1::CHECKPOINT_COMPLETE);
      r.set_bytes(request.bytes());
      r.set_manifest_xxh3(request.manifest_xxh3());
      r.set_completed_unix_ms(now_ms);
      return write(std::move(r));
    }
    case v1::CHECKPOINT_REMOVED: {
      if (!same_directory) return refuse(recorded_in);
      if (old->state() == v1::CHECKPOINT_REMOVED) return unchanged();
      v1::CheckpointRecord r = *old;
      r.set_state(v1::CHECKPOINT_REMOVED);
      return write(std::move(r));
    }
    case v1::CHECKPOINT_SET_ASIDE: {
      // Only a complete checkpoint is set aside: what a load found damaged after its save.
      if (!same_directory) return refuse(recorded_in);
      if (old->state() == v1::CHECKPOINT_SET_ASIDE) return unchanged();
      if (old->state() != v1::CHECKPOINT_COMPLETE) {
        return refuse(absl::StrCat("it is recorded ", StateName(old->state()),
                                   "; only a complete checkpoint is set aside"));
      }
      v1::CheckpointRecord r = *old;
      r.set_state(v1::CHECKPOINT_SET_ASIDE);
      return write(std::move(r));
    }
    default:
      return CheckpointDecision{
          absl::InvalidArgumentError(
              absl::StrCat(about, StateName(request.state()), " is not a state to record")),
          {}};
  }
}

CheckpointRecords::CheckpointRecords(KvStore* kv, const Clock* clock, JobLookup job_status,
                                     CheckpointLimits limits)
    : kv_(kv), clock_(clock), job_status_(std::move(job_status)), limits_(limits) {}

void CheckpointRecords::Record(const std::string& job_id, v1::CheckpointRecord record,
                               RecordCallback done) {
  if (absl::Status s = CheckCheckpointArgs(job_id, record, limits_); !s.ok()) return done(s);
  if (absl::Status s = job_status_(job_id); !s.ok()) return done(s);
  record.set_job_id(job_id);
  {
    MutexLock lock(&mu_);
    std::deque<Pending>& queue = queues_[job_id];
    queue.push_back({std::move(record), std::move(done)});
    // One decision at a time per job: the one in front reads what the one before committed.
    if (queue.size() > 1) return;
  }
  Drain(job_id);
}

CheckpointRecords::RecordCallback CheckpointRecords::PopFront(const std::string& job_id,
                                                              bool* more) {
  MutexLock lock(&mu_);
  auto it = queues_.find(job_id);
  RecordCallback done = std::move(it->second.front().done);
  it->second.pop_front();
  *more = !it->second.empty();
  if (!*more) queues_.erase(it);
  return done;
}

void CheckpointRecords::Drain(const std::string& job_id) {
  for (;;) {
    v1::CheckpointRecord request;
    {
      MutexLock lock(&mu_);
      request = queues_.at(job_id).front().record;
    }
    CheckpointDecision decision =
        DecideCheckpoint(job_id, request, Stored(job_id), clock_->Now(), limits_);
    bool more = false;
    if (decision.ops.empty()) {
      RecordCallback done = PopFront(job_id, &more);
      done(std::move(decision.record));
      if (!more) return;
      continue;
    }
    // The front stays queued until its commit is answered: the next decision must see it.
    kv_->Commit(std::move(decision.ops), [this, job_id, record = *std::move(decision.record)](
                                             absl::StatusOr<CommitResult> committed) mutable {
      bool more = false;
      RecordCallback done = PopFront(job_id, &more);
      if (committed.ok()) {
        // The records are the job's, across generations: no rank or generation to name here.
        LogAboutJob(*Logger("coordinator"), spdlog::level::info, {ShownJobId(job_id)},
                    "checkpoint at step {} recorded {} ({})", record.step(),
                    StateName(record.state()), ShownKey(record.directory()));
        done(std::move(record));
      } else {
        done(absl::Status(committed.status().code(),
                          absl::StrCat(About(job_id, record.step()),
                                       "cannot record it: ", committed.status().message())));
      }
      if (more) Drain(job_id);
    });
    return;
  }
}

std::vector<KeyValue> CheckpointRecords::Stored(const std::string& job_id) const {
  const std::string prefix = CheckpointsPrefix(job_id);
  std::vector<KeyValue> stored = kv_->Range(prefix);
  std::vector<std::pair<std::string, std::string>> bad;  // key, problem
  for (const KeyValue& kv : stored) {
    std::string problem;
    if (!DecodeCheckpoint(job_id, kv, &problem)) bad.emplace_back(kv.key, problem);
  }
  for (const DamagedRecord& d : kv_->Damaged(prefix)) bad.emplace_back(d.key, d.problem);
  if (bad.empty()) return stored;
  MutexLock lock(&mu_);
  for (const auto& [key, problem] : bad) {
    if (!reported_.insert(key).second) continue;
    Logger("coordinator")
        ->error("checkpoint record {} is skipped: {}; the job's other records are served",
                ShownKey(key), problem);
  }
  return stored;
}

absl::StatusOr<std::vector<v1::CheckpointRecord>> CheckpointRecords::List(
    const std::string& job_id) const {
  if (absl::Status s = ValidateJobId(job_id, limits_.max_job_id_bytes); !s.ok()) return s;
  if (absl::Status s = job_status_(job_id); !s.ok()) return s;
  std::vector<v1::CheckpointRecord> out;
  for (const KeyValue& kv : Stored(job_id)) {
    std::string problem;
    if (std::optional<v1::CheckpointRecord> r = DecodeCheckpoint(job_id, kv, &problem)) {
      out.push_back(*std::move(r));
    }
  }
  // Keys are written in step order; sorting keeps a foreign key from breaking it.
  std::stable_sort(out.begin(), out.end(),
                   [](const v1::CheckpointRecord& a, const v1::CheckpointRecord& b) {
                     return a.step() < b.step();
                   });
  return out;
}

}  // namespace zerod::server
