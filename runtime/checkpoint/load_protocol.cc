// Loading a checkpoint (save_protocol.h): rank 0 chooses by the job's records
// (internal/selection.h) and publishes its choice, every rank checks it and reads its part, and
// all agree before the collective that rebuilds the parameters. A choice from a root that rank 0
// finds damaged is set aside and the next newest is tried; any other failure ends the load.

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/checkpoint/internal/damage.h"
#include "runtime/checkpoint/internal/protocol_store.h"
#include "runtime/checkpoint/internal/selection.h"
#include "runtime/checkpoint/save_protocol.h"
#include "runtime/common/status_macros.h"

namespace zerod::checkpoint {
namespace {

namespace fs = std::filesystem;
using internal::Absolute;
using internal::IsDamage;
using internal::RootKind;
using internal::Skipped;
using internal::StepDir;

std::atomic<LoadViewInjection> load_view_injection{nullptr};

// The directory rank `rank` reads for rank 0's choice `dir` (failure injection aside, `dir`).
std::string ViewOf(int64_t rank, const std::string& dir) {
  const LoadViewInjection hook = load_view_injection.load();
  return hook != nullptr ? hook(rank, dir) : dir;
}

struct Chosen {
  std::string dir;
  Manifest manifest;
};

// Whether `d`, skipped, is a checkpoint a load must not pass over in silence to start afresh:
// one of the job's own (its records say so), or a complete checkpoint the records do not list
// (another job's, copied in, the root moved), which a user pointing the run at this root
// expects to resume from.
bool IsAStartingPoint(const StepDir& d) {
  return d.skipped == Skipped::kDamaged || d.skipped == Skipped::kMissing || d.whole ||
         (d.record &&
          (d.record->state == RecordState::kComplete || d.record->state == RecordState::kSetAside));
}

// Rank 0's choice of what to load: one named directory, or the candidates of some roots, newest
// first (an earlier root first at the same step), each vetted before it is offered.
class Chooser {
 public:
  static absl::StatusOr<Chooser> ForRoots(const ResumeRoots& roots, Recorder* recorder) {
    Chooser c(recorder);
    std::vector<std::pair<std::string, RootKind>> all;
    if (!roots.snapshots.empty()) all.emplace_back(roots.snapshots, RootKind::kSnapshots);
    for (const std::string& root : roots.durable) all.emplace_back(root, RootKind::kDurable);
    std::vector<std::string> shown;
    for (const auto& [root, kind] : all) {
      shown.push_back(Absolute(root));
      ZEROD_ASSIGN_OR_RETURN(std::vector<StepDir> dirs,
                             internal::Scan(shown.back(), kind, recorder));
      for (StepDir& d : dirs) {
        (d.skipped == Skipped::kNo ? c.candidates_ : c.skipped_).push_back(std::move(d));
      }
    }
    // Newest first; stable, so that the earlier root wins a tie.
    std::stable_sort(c.candidates_.begin(), c.candidates_.end(),
                     [](const StepDir& a, const StepDir& b) { return a.step > b.step; });
    c.where_ = absl::StrJoin(shown, " and ");
    return c;
  }

  // `path`: a checkpoint directory (it alone: it loads or it is an error), else a root.
  static absl::StatusOr<Chooser> ForPath(const std::string& path, Recorder* recorder) {
    const std::string abs = Absolute(path);
    std::error_code ec;
    const bool exists = fs::exists(fs::symlink_status(abs, ec));
    if (exists && !fs::is_directory(abs, ec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint: ", abs,
                       " is not a directory (expected a checkpoint root or a step "
                       "directory)"));
    }
    const int64_t step = StepOfDirectoryName(fs::path(abs).filename().string());
    if (!internal::HasManifest(abs) && step < 0) return ForRoots({"", {path}}, recorder);
    if (!exists) return absl::NotFoundError(absl::StrCat("checkpoint: ", abs, " does not exist"));
    Chooser c(recorder);
    c.named_ = true;
    c.where_ = abs;
    StepDir d{step, abs};
    ZEROD_ASSIGN_OR_RETURN(auto records, internal::RecordsByDirectory(recorder));
    if (auto r = records.find(abs); r != records.end()) {
      // Set aside, then put back by the operator and named: checked as any other.
      if (r->second.state != RecordState::kComplete && r->second.state != RecordState::kSetAside) {
        return absl::FailedPreconditionError(
            absl::StrCat("checkpoint: ", abs, " is partial: the coordinator's record says ",
                         internal::StateName(r->second.state), " (its save did not finish)"));
      }
      d.record = r->second;
      d.recorded_manifest_xxh3 = r->second.manifest_xxh3;
    }
    c.candidates_.push_back(std::move(d));
    return c;
  }

  // The next checkpoint that passes Vet (damaged ones of a root are set aside on the way);
  // nullopt (with `nothing_because`) when the roots hold none and nothing of the job's was
  // refused. DATA_LOSS naming each when every one left was damaged; FAILED_PRECONDITION naming
  // them when the job's records list checkpoints under the roots that none could be loaded of;
  // the failure Failed() settled on after a failed read.
  absl::StatusOr<std::optional<Chosen>> Next() {
    if (!final_.ok()) return final_;
    while (!candidates_.empty()) {
      StepDir d = std::move(candidates_.front());
      candidates_.erase(candidates_.begin());
      absl::StatusOr<Manifest> m = internal::Vet(d, job_id());
      if (m.ok()) {
        current_ = d;
        return Chosen{d.dir, *std::move(m)};
      }
      // Rank 0's own finding: damage is set aside, anything else ends the load.
      if (named_ || !IsDamage(m.status())) return m.status();
      SetAsideDamaged(std::move(d), m.status());
    }
    return Nothing();
  }

  // Every rank agreed that the current choice failed with `agreed`, damage some rank found;
  // `own` is rank 0's own verdict. The choice is set aside only when rank 0 finds the damage
  // itself (its own read, else a check of the whole checkpoint); otherwise Next() returns the
  // failure, the checkpoint left as it was.
  void Failed(const absl::Status& agreed, const absl::Status& own) {
    if (!current_) {
      final_ = absl::Status(agreed.code(), agreed.message());
      return;
    }
    StepDir d = *std::move(current_);
    current_.reset();
    const absl::Status found = IsDamage(own) ? own : Verify(ViewOf(0, d.dir));
    if (IsDamage(found)) {
      SetAsideDamaged(std::move(d), found);
      return;
    }
    // Without the damage mark, so that every rank ends the load on it.
    final_ = absl::Status(
        agreed.code(),
        absl::StrCat(agreed.message(), "; rank 0 ",
                     found.ok()
                         ? absl::StrCat("reads ", d.dir, " intact")
                         : absl::StrCat("could not check ", d.dir, " (", found.message(), ")"),
                     ", so it is left as it is: does every node see the same filesystem there, "
                     "and is the reporting rank's node sound?"));
  }

  // After loading step `step`: the job's checkpoints newer than it whose directories are gone
  // from a root that is there are recorded set aside (the step may be saved again), and what was
  // skipped on the way is logged.
  void Loaded(int64_t step) {
    std::vector<StepDir> newer;
    for (StepDir& d : skipped_) {
      if (d.step <= step) continue;
      std::error_code ec;
      if (d.skipped == Skipped::kMissing && d.record && d.record->state == RecordState::kComplete &&
          fs::is_directory(fs::path(d.dir).parent_path(), ec)) {
        absl::StrAppend(&d.why, "; ", internal::SetAside(d, recorder_));
      }
      newer.push_back(d);
    }
    if (newer.empty()) return;
    internal::Log().warn("checkpoint: loading {} (step {}); skipped newer: {}",
                         current_ ? current_->dir : "?", step, internal::Describe(newer));
  }

  bool falls_back() const { return !named_; }
  const std::string& nothing_because() const { return nothing_because_; }

 private:
  explicit Chooser(Recorder* recorder) : recorder_(recorder) {}
  const std::string& job_id() const {
    static const std::string kNone = "(no coordinator)";
    return recorder_ != nullptr ? recorder_->job_id() : kNone;
  }

  void SetAsideDamaged(StepDir d, const absl::Status& why) {
    d.skipped = Skipped::kDamaged;
    d.why = absl::StrCat(why.message(), "; ", internal::SetAside(d, recorder_));
    skipped_.push_back(std::move(d));
  }

  absl::StatusOr<std::optional<Chosen>> Nothing() {
    const std::string skipped =
        skipped_.empty() ? "" : absl::StrCat(" (skipped: ", internal::Describe(skipped_), ")");
    if (std::any_of(skipped_.begin(), skipped_.end(),
                    [](const StepDir& d) { return d.skipped == Skipped::kDamaged; })) {
      return absl::DataLossError(
          absl::StrCat("checkpoint: no intact checkpoint under ", where_, skipped));
    }
    if (std::any_of(skipped_.begin(), skipped_.end(), IsAStartingPoint)) {
      const bool own = std::any_of(skipped_.begin(), skipped_.end(), [](const StepDir& d) {
        return IsAStartingPoint(d) && !d.whole;
      });
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint: ",
          own ? absl::StrCat("job ", job_id(), "'s records list checkpoints under ", where_,
                             " that none can be loaded of")
              : absl::StrCat(where_, " holds checkpoints job ", job_id(),
                             " may not resume from as they are"),
          skipped,
          "; refusing to start from scratch over them: put the job's own back (or mount their "
          "filesystem), name a checkpoint directory to load it, or start afresh in an empty "
          "directory"));
    }
    nothing_because_ = absl::StrCat("no complete checkpoint under ", where_, skipped);
    if (!skipped_.empty())
      internal::Log().warn("checkpoint: nothing to load: {}", nothing_because_);
    return std::nullopt;
  }

  Recorder* recorder_;
  bool named_ = false;
  std::string where_;
  std::vector<StepDir> candidates_;  // newest first; the front one is offered next
  std::vector<StepDir> skipped_;     // with why
  std::optional<StepDir> current_;   // the one offered last
  std::string nothing_because_;
  absl::Status final_;  // what ends the load after a failed read (Failed)
};

// Rank 0's choice as published under the call's key: "D <step> <created ms> <falls back>\n<dir>",
// "N\n<why nothing>", or an error.
struct Published {
  bool nothing = false;
  std::string dir;  // or why nothing
  int64_t step = 0;
  int64_t created_ms = 0;
  bool falls_back = false;
};

absl::StatusOr<Published> ParsePublished(const std::string& value, const std::string& key) {
  ZEROD_ASSIGN_OR_RETURN(const std::string choice, internal::DecodeStatus(value, key));
  const size_t newline = choice.find('\n');
  const std::string head = choice.substr(0, newline);
  Published p;
  p.dir = newline == std::string::npos ? "" : choice.substr(newline + 1);
  if (head == "N") {
    p.nothing = true;
    return p;
  }
  const std::vector<std::string> fields = absl::StrSplit(head, ' ');
  if (fields.size() != 4 || fields[0] != "D" || !absl::SimpleAtoi(fields[1], &p.step) ||
      !absl::SimpleAtoi(fields[2], &p.created_ms) || (fields[3] != "0" && fields[3] != "1")) {
    return absl::InternalError(absl::StrCat("checkpoint: store key ", key, " holds '", choice,
                                            "', not a choice of checkpoint"));
  }
  p.falls_back = fields[3] == "1";
  return p;
}

// Every rank loads rank 0's choice `p`: each checks that it sees rank 0's checkpoint (a directory
// every rank shares), reads its part, and all learn each other's verdict before FinishRestore's
// collective (stages 1-2 all-gather the parameters), so nobody waits in it for a rank that gave
// up. A damaged block only one rank reads fails that rank, and so every rank. `own` gets this
// rank's own verdict (rank 0 sets a checkpoint aside only for damage it found itself).
absl::StatusOr<LoadedCheckpoint> LoadPublished(engine::ZeroEngine& engine, comm::Store& store,
                                               const std::string& key, int64_t call,
                                               const Published& p, std::optional<Manifest> chosen,
                                               absl::Duration timeout, absl::Status& own) {
  const absl::Time deadline = absl::Now() + timeout;
  const int64_t rank = engine.rank();
  const int64_t world = engine.plan().world_size();
  const std::string view = ViewOf(rank, p.dir);
  absl::StatusOr<Manifest> manifest =
      chosen ? absl::StatusOr<Manifest>(*std::move(chosen)) : ReadManifest(view);
  absl::Status mine = manifest.status();
  if (mine.ok() && (manifest->step != p.step || manifest->created_unix_ms != p.created_ms)) {
    mine = absl::FailedPreconditionError(absl::StrCat(
        "checkpoint: rank ", rank, " reads another checkpoint at ", p.dir, " (step ",
        manifest->step, ", saved at ", manifest->created_unix_ms, " ms) than rank 0 (step ", p.step,
        ", saved at ", p.created_ms, " ms): is the directory on a filesystem every rank shares?"));
  }
  if (mine.ok()) mine = CheckLayout(*manifest, engine.plan().tensors(), p.dir);
  own = mine;
  ZEROD_RETURN_IF_ERROR(internal::Agree(store, absl::StrCat(key, "/rank/"), rank, world, mine,
                                        deadline, timeout, absl::StrCat("check ", p.dir)));
  // Every rank reached this call: the previous call's keys are read by nobody any more.
  if (rank == 0) internal::ForgetKeys(store, call - 1);

  LoadedCheckpoint loaded;
  loaded.step = p.step;
  loaded.directory = p.dir;
  const absl::Time read_start = absl::Now();
  absl::Status read = LoadState(view, *manifest, engine);
  loaded.read_time = absl::Now() - read_start;
  if (read.ok()) {
    absl::StatusOr<std::string> extra = ReadExtra(view, *manifest, rank);
    read = extra.status();
    if (extra.ok()) loaded.extra = *std::move(extra);
  }
  own = read;
  ZEROD_RETURN_IF_ERROR(internal::Agree(store, absl::StrCat(key, "/read/"), rank, world, read,
                                        deadline, timeout, absl::StrCat("read ", p.dir)));
  ZEROD_RETURN_IF_ERROR(engine.FinishRestore(manifest->counters));
  loaded.manifest = *std::move(manifest);
  return loaded;
}

// Rank 0's next choice, encoded for the store; `manifest` gets the chosen one's.
std::string Publish(absl::StatusOr<Chooser>& chooser, std::optional<Manifest>& manifest) {
  if (!chooser.ok()) return internal::EncodeStatus(chooser.status());
  absl::StatusOr<std::optional<Chosen>> next = chooser->Next();
  if (!next.ok()) return internal::EncodeStatus(next.status());
  if (!next->has_value()) {
    return internal::EncodeStatus(absl::OkStatus(), "N\n" + chooser->nothing_because());
  }
  Chosen& c = **next;
  const std::string head = absl::StrCat("D ", c.manifest.step, " ", c.manifest.created_unix_ms, " ",
                                        chooser->falls_back() ? 1 : 0);
  manifest = std::move(c.manifest);
  return internal::EncodeStatus(absl::OkStatus(), absl::StrCat(head, "\n", c.dir));
}

// Load's work; `make_chooser` runs on rank 0 only. nullopt (with `nothing`, which rank 0 has
// logged when it skipped anything) when there is nothing to load.
template <typename MakeChooser>
absl::StatusOr<std::optional<LoadedCheckpoint>> LoadChosen(engine::ZeroEngine& engine,
                                                           comm::Store& store,
                                                           const MakeChooser& make_chooser,
                                                           absl::Duration timeout,
                                                           std::string& nothing) {
  const int64_t rank = engine.rank();
  const int64_t world = engine.plan().world_size();
  std::optional<absl::StatusOr<Chooser>> chooser;
  if (rank == 0) chooser.emplace(make_chooser());
  for (;;) {
    ZEROD_ASSIGN_OR_RETURN(const int64_t call, internal::NextCall(store, rank));
    const std::string key = absl::StrCat("ckpt/load/", call);
    std::string published;
    std::optional<Manifest> manifest;  // rank 0's choice, read once
    if (rank == 0) {
      published = Publish(*chooser, manifest);
      std::vector<std::string> keys = internal::RankKeys(key + "/rank/", world);
      for (std::string& k : internal::RankKeys(key + "/read/", world)) keys.push_back(std::move(k));
      keys.push_back(key);
      ZEROD_RETURN_IF_ERROR(internal::RememberKeys(store, call, keys));
      ZEROD_RETURN_IF_ERROR(store.Set(key, published));
    } else {
      ZEROD_ASSIGN_OR_RETURN(
          published, internal::Await(store, key, absl::Now() + timeout,
                                     "rank 0 did not choose a checkpoint to load", timeout));
    }
    ZEROD_ASSIGN_OR_RETURN(const Published p, ParsePublished(published, key));
    if (p.nothing) {
      nothing = p.dir;
      return std::nullopt;
    }
    absl::Status own;
    absl::StatusOr<LoadedCheckpoint> loaded =
        LoadPublished(engine, store, key, call, p, std::move(manifest), timeout, own);
    if (loaded.ok()) {
      if (rank == 0) (*chooser)->Loaded(loaded->step);
      return std::optional<LoadedCheckpoint>(*std::move(loaded));
    }
    // Every rank holds the same agreed failure, so all decide alike whether to go on: for damage,
    // to the next call, where rank 0 publishes an older checkpoint or the failure that ends it.
    if (!p.falls_back || !IsDamage(loaded.status())) return loaded.status();
    if (rank == 0) (*chooser)->Failed(loaded.status(), own);
  }
}

}  // namespace

void SetLoadViewInjectionForTesting(LoadViewInjection hook) { load_view_injection.store(hook); }

absl::StatusOr<std::string> LatestComplete(const std::string& root, Recorder* recorder) {
  ZEROD_ASSIGN_OR_RETURN(std::vector<StepDir> dirs,
                         internal::Scan(Absolute(root), RootKind::kDurable, recorder));
  std::vector<StepDir> skipped;
  for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
    if (it->skipped == Skipped::kNo) return it->dir;
    skipped.push_back(*it);
  }
  return absl::NotFoundError(absl::StrCat("checkpoint: no complete checkpoint under ",
                                          Absolute(root), skipped.empty() ? "" : " (skipped: ",
                                          internal::Describe(skipped), skipped.empty() ? "" : ")"));
}

absl::StatusOr<std::optional<LoadedCheckpoint>> LoadIfAny(engine::ZeroEngine& engine,
                                                          comm::Store& store,
                                                          const std::string& path,
                                                          Recorder* recorder,
                                                          absl::Duration timeout) {
  std::string nothing;
  return LoadChosen(
      engine, store, [&] { return Chooser::ForPath(path, recorder); }, timeout, nothing);
}

absl::StatusOr<std::optional<LoadedCheckpoint>> LoadNewestIfAny(engine::ZeroEngine& engine,
                                                                comm::Store& store,
                                                                const ResumeRoots& roots,
                                                                Recorder* recorder,
                                                                absl::Duration timeout) {
  if (roots.snapshots.empty() && roots.durable.empty()) {
    return absl::InvalidArgumentError("checkpoint: no roots to load from");
  }
  std::string nothing;
  return LoadChosen(
      engine, store, [&] { return Chooser::ForRoots(roots, recorder); }, timeout, nothing);
}

absl::StatusOr<LoadedCheckpoint> Load(engine::ZeroEngine& engine, comm::Store& store,
                                      const std::string& path, Recorder* recorder,
                                      absl::Duration timeout) {
  std::string nothing;
  ZEROD_ASSIGN_OR_RETURN(
      std::optional<LoadedCheckpoint> loaded,
      LoadChosen(
          engine, store, [&] { return Chooser::ForPath(path, recorder); }, timeout, nothing));
  if (!loaded.has_value()) return absl::NotFoundError(absl::StrCat("checkpoint: ", nothing));
  return *std::move(loaded);
}

}  // namespace zerod::checkpoint
