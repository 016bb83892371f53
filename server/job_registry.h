#ifndef ZEROD_SERVER_JOB_REGISTRY_H_
#define ZEROD_SERVER_JOB_REGISTRY_H_

// JobRegistry: membership, plans, leases and events of every job. It knows nothing of gRPC: the
// services translate calls into these methods and callbacks.
//
// Every membership change is written to the KvStore before anyone is told; heartbeats only touch
// memory. Locks: jobs_mu_ guards the map of jobs, each Job its own state; taken in the order
// open_mu_, a job's lock, jobs_mu_. Callbacks (join and
// leave answers, commit results) run after the job's lock is released; events are sent to
// EventSinks under it, so that every watcher sees a job's events in the order they happened.
//
// A join goes through three parts, each in its own file: admission (join_admission.h) decides
// what to do, RankSlots (rank_slots.h) keeps which ranks are free, and the plan builder
// (plan_builder.h) makes the plan once every rank is in.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "runtime/common/mutex.h"
#include "server/clock.h"
#include "server/job.h"
#include "server/join_admission.h"
#include "server/state/kv_store.h"
#include "server/timer_queue.h"
#include "zerod/v1/inspect.pb.h"

namespace zerod::server {

struct RegistryOptions {
  absl::Duration lease_ttl = absl::Seconds(10);
  // After a restart, and after a job forms, members get lease_ttl + restart_grace to (re)start
  // heartbeating: the daemon was away, or is still handing the plan to every rank.
  absl::Duration restart_grace = absl::Seconds(10);
  // What one join may declare: world size and job id length.
  JoinLimits join_limits;
  // Jobs that may be open at once (forming, running or degraded; ended ones do not count).
  int64_t max_jobs = 1024;
};

// Entries a heartbeat's memory or communication report may carry, and the longest name in them:
// a rank reports a handful of categories, and the reports live in memory with the member.
inline constexpr int kMaxReportEntries = 64;
inline constexpr size_t kMaxReportNameBytes = 64;

class JobRegistry {
 public:
  // Owns a TimerQueue thread for join deadlines, stopped first on destruction. `clock` must
  // outlive the registry.
  JobRegistry(KvStore* kv, const Clock* clock, RegistryOptions options);
  ~JobRegistry();
  JobRegistry(const JobRegistry&) = delete;
  JobRegistry& operator=(const JobRegistry&) = delete;

  // Loads every job from the KvStore (daemon start). A job whose records are damaged or do not
  // decode is quarantined (job_records.h): logged, its records moved aside, the others loaded.
  absl::Status Recover();
  // The error for a job that is not here: NOT_FOUND, or DATA_LOSS naming why it was quarantined.
  absl::Status Missing(const std::string& job_id) const;

  // Joins; `done` runs exactly once: at once on bad input, when the job forms, or with
  // DEADLINE_EXCEEDED at `deadline` (a time of the registry's Clock). A join that would open a
  // job past RegistryOptions::max_jobs is RESOURCE_EXHAUSTED. A job that never formed is removed
  // once nobody is in it (its joins refused, timed out or left), store keys and all.
  void Join(JoinArgs args, absl::Time deadline, JoinCallback done);
  absl::StatusOr<v1::PlanInputs> GetPlan(const std::string& job_id);
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  void Leave(const std::string& job_id, int64_t rank,
             std::function<void(absl::StatusOr<int64_t>)> done);
  void EndJob(const std::string& job_id, std::function<void(absl::Status)> done);

  // Marks members whose lease ran out as lost and moves their job's generation on. The daemon
  // calls it from a reaper thread; tests call it after advancing a FakeClock. `unheard` is how long
  // the daemon itself did not run (a sweep that came that late: stopped, swapped out, starved):
  // no heartbeat could be answered then either, so every active lease is first moved on by that
  // much, and a paused daemon does not declare every rank lost when it resumes.
  void ExpireLeases(absl::Duration unheard = absl::ZeroDuration());

  // Registers a Watch stream; the sink first receives a SNAPSHOT event.
  absl::StatusOr<int64_t> Subscribe(const std::string& job_id, std::shared_ptr<EventSink> sink);
  void Unsubscribe(const std::string& job_id, int64_t id);

  // Inspection.
  bool JobExists(const std::string& job_id) const;
  // Known and ended (an unknown job is not ended).
  bool JobEnded(const std::string& job_id) const;
  std::vector<v1::JobSummary> ListJobs() const;
  absl::StatusOr<v1::JobDescription> Describe(const std::string& job_id) const;
  absl::StatusOr<std::shared_ptr<const plan::ShardPlan>> ShardPlanOf(
      const std::string& job_id) const;

  // Fails every waiting join and closes every watch with UNAVAILABLE (daemon shutdown).
  void Shutdown();

  // Runs `callback` on the thread that runs join deadlines, at `at` (a time of the Clock): the
  // daemon's watchdog posts probes here, a probe that runs proving that thread is not stuck.
  void RunOnTimerThread(absl::Time at, std::function<void()> callback) {
    timers_.Schedule(at, std::move(callback));
  }

  absl::Duration lease_ttl() const { return options_.lease_ttl; }
  // What a join may declare here (CheckJoinArgs' limits).
  const JoinLimits& join_limits() const { return options_.join_limits; }

 private:
  using Deferred = std::vector<std::function<void()>>;

  std::shared_ptr<Job> Find(const std::string& job_id) const;
  std::shared_ptr<Job> FindOrCreate(const std::string& job_id);
  std::vector<std::shared_ptr<Job>> AllJobs() const;
  // Jobs open now other than `except` (locks each job in turn: call it holding no job's lock).
  int64_t OpenJobsExcept(const Job* except) const;
  // A job nobody is in any more while it (re-)forms: no "forming 0/N" job is left by joins that
  // were refused, timed out or left. One that never formed is removed; one that formed before is
  // ended (recorded). Its watchers are told and closed.
  void ForgetIfUnformed(const std::shared_ptr<Job>& job, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);

  // One attempt at a join; what must run after the locks are released goes to `deferred`.
  // Returns false, having done nothing, when the join would open a job and `may_open` is false
  // (the caller then holds open_mu_ and tries again).
  bool TryJoin(JoinArgs& args, absl::Time deadline, JoinCallback& done, bool may_open,
               Deferred& deferred);
  // Applies an AwaitFormation decision: the join enters its rank and waits.
  void Enter(const std::shared_ptr<Job>& job, JoinArgs args, const AwaitFormation& decision,
             absl::Time deadline, JoinCallback done, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  void JoinTimedOut(const std::shared_ptr<Job>& job, int64_t rank, int64_t ticket);

  void StartFormation(const std::shared_ptr<Job>& job, Deferred& deferred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu);
  void FinishFormation(const std::shared_ptr<Job>& job, absl::Status committed,
                       v1::PlanInputs inputs, std::shared_ptr<const plan::ShardPlan> plan);

  KvStore* const kv_;
  const Clock* const clock_;
  const RegistryOptions options_;

  // Held by a join that opens a job, from counting the open jobs until it has entered: the
  // count cannot go past max_jobs by two joins opening jobs at once. Taken before any job's lock.
  Mutex open_mu_;
  mutable Mutex jobs_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  // Jobs quarantined at a start and not joined since -> why, and where their records are.
  std::map<std::string, std::string> quarantined_ ABSL_GUARDED_BY(jobs_mu_);
  int64_t next_watch_id_ ABSL_GUARDED_BY(jobs_mu_) = 1;

  // Last: destroyed first, so no timer runs against a half-destroyed registry.
  TimerQueue timers_;
};

// NOT_FOUND for an unknown job, worded the same by every call.
absl::Status JobNotFound(const std::string& job_id);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_JOB_REGISTRY_H_
