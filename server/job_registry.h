#ifndef ZEROD_SERVER_JOB_REGISTRY_H_
#define ZEROD_SERVER_JOB_REGISTRY_H_

// JobRegistry: membership, plans, leases and events of every job. It knows nothing of gRPC: the
// services translate calls into these methods and callbacks.
//
// Every membership change is written to the KvStore before anyone is told; heartbeats only touch
// memory. Locks: jobs_mu_ guards the map of jobs, each Job its own state. Callbacks (join and
// leave answers, commit results) run after the job's lock is released; events are sent to
// EventSinks under it, so that every watcher sees a job's events in the order they happened.
//
// A join goes through three parts, each in its own file: admission (join_admission.h) decides
// what to do, RankSlots (rank_slots.h) keeps which ranks are free, and the plan builder
// (plan_builder.h) makes the plan once every rank is in.

#include <functional>
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
};

class JobRegistry {
 public:
  // Owns a TimerQueue thread for join deadlines, stopped first on destruction. `clock` must
  // outlive the registry.
  JobRegistry(KvStore* kv, const Clock* clock, RegistryOptions options);
  ~JobRegistry();
  JobRegistry(const JobRegistry&) = delete;
  JobRegistry& operator=(const JobRegistry&) = delete;

  // Loads every job from the KvStore (daemon start).
  absl::Status Recover();

  // Joins; `done` runs exactly once: at once on bad input, when the job forms, or with
  // DEADLINE_EXCEEDED at `deadline` (a time of the registry's Clock).
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
  std::vector<v1::JobSummary> ListJobs() const;
  absl::StatusOr<v1::JobDescription> Describe(const std::string& job_id) const;
  absl::StatusOr<std::shared_ptr<const plan::ShardPlan>> ShardPlanOf(
      const std::string& job_id) const;

  // Fails every waiting join and closes every watch with UNAVAILABLE (daemon shutdown).
  void Shutdown();

  absl::Duration lease_ttl() const { return options_.lease_ttl; }

 private:
  using Deferred = std::vector<std::function<void()>>;

  std::shared_ptr<Job> Find(const std::string& job_id) const;
  std::shared_ptr<Job> FindOrCreate(const std::string& job_id);
  std::vector<std::shared_ptr<Job>> AllJobs() const;

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

  mutable Mutex jobs_mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> jobs_ ABSL_GUARDED_BY(jobs_mu_);
  int64_t next_watch_id_ ABSL_GUARDED_BY(jobs_mu_) = 1;

  // Last: destroyed first, so no timer runs against a half-destroyed registry.
  TimerQueue timers_;
};

// NOT_FOUND for an unknown job, worded the same by every call.
absl::Status JobNotFound(const std::string& job_id);

}  // namespace zerod::server

#endif  // ZEROD_SERVER_JOB_REGISTRY_H_
