#include "server/job_registry.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <variant>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/job_records.h"
#include "server/join_admission.h"
#include "server/logging.h"
#include "server/plan_builder.h"

namespace zerod::server {
namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

void RunAll(std::vector<std::function<void()>>& deferred) {
  for (auto& f : deferred) f();
}

void Broadcast(Job& job, v1::JobEvent::Kind kind, int64_t rank, std::string message, absl::Time now)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  if (job.watchers.empty()) return;
  v1::JobEvent e;
  e.set_kind(kind);
  e.set_job_id(job.id);
  e.set_generation(job.generation);
  e.set_job_state(job.state);
  e.set_rank(rank);
  if (rank >= 0 && job.members[static_cast<size_t>(rank)].has_value()) {
    e.set_step(job.members[static_cast<size_t>(rank)]->step);
  }
  e.set_message(std::move(message));
  e.set_unix_ms(absl::ToUnixMillis(now));
  for (auto& [id, sink] : job.watchers) sink->Send(e);
}

std::string MissingRanks(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  std::vector<int64_t> missing;
  for (int64_t r = 0; r < job.world_size && missing.size() < 8; ++r) {
    if (!IsLive(job.members[static_cast<size_t>(r)])) missing.push_back(r);
  }
  std::string out = absl::StrJoin(missing, ", ");
  if (job.world_size - job.slots.live() > static_cast<int64_t>(missing.size())) out += ", ...";
  return out;
}

// Fails every waiting join with `status` and frees their slots.
void FailJoining(Job& job, const absl::Status& status, std::vector<std::function<void()>>& deferred)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  for (int64_t r = 0; r < job.world_size; ++r) {
    std::optional<Member>& m = job.members[static_cast<size_t>(r)];
    if (!m.has_value() || m->state != v1::MEMBER_JOINING) continue;
    deferred.push_back([waiter = std::move(m->waiter), status] { waiter(status); });
    m.reset();
    job.slots.Free(r);
  }
}

JoinResult ResultFor(const Job& job, int64_t rank, absl::Duration ttl)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  return {rank, job.generation, job.world_size, ttl, job.plan_bytes};
}

JobAdmissionView AdmissionView(const Job& job, int64_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  JobAdmissionView view;
  view.job_id = job.id;
  view.forming = job.forming;
  view.live_members = job.slots.live();
  view.world_size = job.world_size;
  view.generation = job.generation;
  view.running = job.plan.has_value() && job.state == v1::JOB_RUNNING;
  view.layout_digest = job.layout_digest;
  view.layout_digest_rank = job.layout_digest_rank;
  if (rank >= 0 && rank < job.world_size && job.members[static_cast<size_t>(rank)].has_value()) {
    view.holder = &*job.members[static_cast<size_t>(rank)];
  }
  view.lowest_free_rank = job.slots.LowestFree();
  return view;
}

// Starts the job afresh with the shape of the join that re-forms it.
void Reform(Job& job, const JoinArgs& args) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  job.world_size = args.world_size;
  job.members.assign(static_cast<size_t>(args.world_size), std::nullopt);
  job.slots.Reset(args.world_size);
  job.options = args.options;
  job.layout_digest = args.layout_digest;
  job.layout = args.layout;
  job.state = v1::JOB_FORMING;
  job.plan.reset();
  job.plan_bytes.reset();
  job.shard_plan.reset();
}

}  // namespace

absl::Status JobNotFound(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("job ", ShownJobId(job_id), " not found"));
}

JobRegistry::JobRegistry(KvStore* kv, const Clock* clock, RegistryOptions options)
    : kv_(kv), clock_(clock), options_(options), timers_(clock) {}

JobRegistry::~JobRegistry() = default;

absl::Status JobRegistry::Recover() {
  const std::vector<KeyValue> records = kv_->Range("jobs/");
  std::map<std::string, std::vector<KeyValue>> by_job;
  for (const KeyValue& kv : records) {
    const size_t end = kv.key.find('/', 5);
    if (end == std::string::npos) continue;
    const std::string id = kv.key.substr(5, end - 5);
    // Store keys are served from the KvStore directly; the registry needs the rest.
    if (kv.key.compare(end + 1, 3, "kv/") == 0) continue;
    by_job[id].push_back(kv);
  }
  const absl::Time lease_expiry = clock_->Now() + options_.lease_ttl + options_.restart_grace;
  MutexLock lock(&jobs_mu_);
  for (const auto& [id, job_records] : by_job) {
    auto job = DecodeJob(id, job_records, lease_expiry);
    if (!job.ok()) return job.status();
    jobs_[id] = *std::move(job);
  }
  return absl::OkStatus();
}

std::shared_ptr<Job> JobRegistry::Find(const std::string& job_id) const {
  MutexLock lock(&jobs_mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

std::shared_ptr<Job> JobRegistry::FindOrCreate(const std::string& job_id) {
  MutexLock lock(&jobs_mu_);
  std::shared_ptr<Job>& slot = jobs_[job_id];
  if (!slot) slot = std::make_shared<Job>(job_id);
  return slot;
}

std::vector<std::shared_ptr<Job>> JobRegistry::AllJobs() const {
  MutexLock lock(&jobs_mu_);
  std::vector<std::shared_ptr<Job>> jobs;
  jobs.reserve(jobs_.size());
  for (const auto& [id, job] : jobs_) jobs.push_back(job);
  return jobs;
}

bool JobRegistry::JobExists(const std::string& job_id) const { return Find(job_id) != nullptr; }

void JobRegistry::Join(JoinArgs args, absl::Time deadline, JoinCallback done) {
  if (absl::Status s = CheckJoinArgs(args); !s.ok()) return done(s);
  std::shared_ptr<Job> job = FindOrCreate(args.job_id);
  Deferred deferred;
  {
    MutexLock lock(&job->mu);
    std::visit(
        Overloaded{
            [&](const RefuseJoin& refuse) {
              deferred.push_back([done, status = refuse.status] { done(status); });
            },
            [&](const AnswerAgain& answer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu) {
              deferred.push_back([done, result = ResultFor(*job, answer.rank, options_.lease_ttl)] {
                done(result);
              });
            },
            [&](const AwaitFormation& enter) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu) {
              Enter(job, std::move(args), enter, deadline, std::move(done), deferred);
            },
        },
        DecideJoin(AdmissionView(*job, args.rank), args));
  }
  RunAll(deferred);
}

void JobRegistry::Enter(const std::shared_ptr<Job>& job, JoinArgs args,
                        const AwaitFormation& decision, absl::Time deadline, JoinCallback done,
                        Deferred& deferred) {
  const int64_t rank = decision.rank;
  if (decision.reform) {
    Reform(*job, args);
    job->layout_digest_rank = rank;
  }
  std::optional<Member>& slot = job->members[static_cast<size_t>(rank)];
  if (decision.supersede) {
    deferred.push_back([waiter = std::move(slot->waiter)] {
      waiter(absl::AbortedError("superseded by a retry of the same rank"));
    });
  } else {
    // The admission decision chose a free rank; a taken one here is a broken invariant.
    if (!job->slots.Take(rank)) {
      Logger("coordinator")->critical("job {}: admitted rank {} was not free", job->id, rank);
      std::abort();
    }
  }
  if (job->layout.empty() && !args.layout.empty()) job->layout = std::move(args.layout);
  Member m;
  m.state = v1::MEMBER_JOINING;
  m.host = std::move(args.host);
  m.device = std::move(args.device);
  m.budget_bytes = args.budget_bytes;
  m.layout_digest = std::move(args.layout_digest);
  m.generation = job->generation;
  m.ticket = job->next_ticket++;
  m.waiter = std::move(done);
  const int64_t ticket = m.ticket;
  slot = std::move(m);
  Broadcast(*job, v1::JobEvent::MEMBER_JOINED, rank,
            absl::StrCat(job->slots.live(), " of ", job->world_size, " ranks joined"),
            clock_->Now());
  timers_.Schedule(deadline, [this, job, rank, ticket] { JoinTimedOut(job, rank, ticket); });
  if (job->slots.live() == job->world_size) StartFormation(job, deferred);
}

void JobRegistry::JoinTimedOut(const std::shared_ptr<Job>& job, int64_t rank, int64_t ticket) {
  Deferred deferred;
  {
    MutexLock lock(&job->mu);
    if (job->forming || rank >= job->world_size) return;
    std::optional<Member>& m = job->members[static_cast<size_t>(rank)];
    if (!m.has_value() || m->state != v1::MEMBER_JOINING || m->ticket != ticket) return;
    const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
        "job ", job->id, ": rank ", rank, " waited until its deadline; ", job->slots.live(), " of ",
        job->world_size, " ranks joined (missing: ", MissingRanks(*job), ")"));
    deferred.push_back([waiter = std::move(m->waiter), status] { waiter(status); });
    m.reset();
    job->slots.Free(rank);
  }
  RunAll(deferred);
}

void JobRegistry::StartFormation(const std::shared_ptr<Job>& job, Deferred& deferred) {
  auto built = BuildPlan({.job_id = job->id,
                          .layout = job->layout,
                          .layout_digest = job->layout_digest,
                          .options = job->options,
                          .world_size = job->world_size,
                          .generation = job->generation + 1,
                          .budget_bytes = SmallestBudget(job->members)});
  if (!built.ok()) {
    FailJoining(*job, built.status(), deferred);
    return;
  }
  std::vector<KvOp> ops = FormationRecords(*job, built->inputs);
  job->forming = true;
  job->formation_started = clock_->Now();
  deferred.push_back([this, job, ops = std::move(ops), built = *std::move(built)]() mutable {
    kv_->Commit(std::move(ops), [this, job,
                                 built = std::move(built)](absl::StatusOr<CommitResult> r) mutable {
      FinishFormation(job, r.status(), std::move(built.inputs), std::move(built.shard_plan));
    });
  });
}

void JobRegistry::FinishFormation(const std::shared_ptr<Job>& job, absl::Status committed,
                                  v1::PlanInputs inputs,
                                  std::shared_ptr<const plan::ShardPlan> plan) {
  Deferred deferred;
  {
    MutexLock lock(&job->mu);
    job->forming = false;
    if (!committed.ok()) {
      FailJoining(*job,
                  absl::UnavailableError(absl::StrCat(
                      "job ", job->id, ": could not store the plan: ", committed.message())),
                  deferred);
    } else {
      job->generation = inputs.generation();
      job->state = v1::JOB_RUNNING;
      job->plan_bytes = std::make_shared<const std::string>(inputs.SerializeAsString());
      job->plan = std::move(inputs);
      job->shard_plan = std::move(plan);
      const absl::Time now = clock_->Now();
      for (int64_t r = 0; r < job->world_size; ++r) {
        std::optional<Member>& m = job->members[static_cast<size_t>(r)];
        if (!m.has_value() || m->state != v1::MEMBER_JOINING) continue;
        m->state = v1::MEMBER_ACTIVE;
        m->generation = job->generation;
        // The first lease also covers delivering the plan to every rank (seconds at 100,000).
        m->lease_expiry = now + options_.lease_ttl + options_.restart_grace;
        deferred.push_back([waiter = std::move(m->waiter),
                            result = ResultFor(*job, r, options_.lease_ttl)] { waiter(result); });
      }
      Logger("coordinator")
          ->info("job {} formed: generation {}, {} ranks, stage {}, plan {}, stored in {}", job->id,
                 job->generation, job->world_size, job->plan->options().stage(),
                 job->plan->plan_digest(), absl::FormatDuration(now - job->formation_started));
      Broadcast(*job, v1::JobEvent::JOB_FORMED, -1,
                absl::StrCat("all ", job->world_size, " ranks active; stage ",
                             job->plan->options().stage(), ", plan ", job->plan->plan_digest()),
                now);
    }
  }
  RunAll(deferred);
}

absl::StatusOr<v1::PlanInputs> JobRegistry::GetPlan(const std::string& job_id) {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return JobNotFound(job_id);
  MutexLock lock(&job->mu);
  if (!job->plan.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id,
                                                      " has no plan yet: ", job->slots.live(),
                                                      " of ", job->world_size, " ranks joined"));
  }
  return *job->plan;
}

absl::StatusOr<v1::HeartbeatResponse> JobRegistry::Heartbeat(const v1::HeartbeatRequest& req) {
  std::shared_ptr<Job> job = Find(req.job_id());
  if (!job) return JobNotFound(req.job_id());
  const absl::Time now = clock_->Now();
  MutexLock lock(&job->mu);
  if (req.rank() < 0 || req.rank() >= job->world_size) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job->id, ": rank ", req.rank(),
                                                   " is out of range for world size ",
                                                   job->world_size));
  }
  std::optional<Member>& m = job->members[static_cast<size_t>(req.rank())];
  if (!m.has_value() || m->state != v1::MEMBER_ACTIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job->id, ": rank ", req.rank(), " is not an active member (",
                     m.has_value() ? MemberStateName(m->state) : "never joined",
                     "); generation is ", job->generation));
  }
  m->lease_expiry = now + options_.lease_ttl;
  m->last_heartbeat_unix_ms = absl::ToUnixMillis(now);
  const bool new_step = req.step() != m->step;
  m->step = req.step();
  if (!req.memory_bytes().empty()) {
    m->memory_bytes.clear();
    m->memory_bytes.insert(req.memory_bytes().begin(), req.memory_bytes().end());
  }
  if (!req.comm_bytes().empty()) {
    m->comm_bytes.clear();
    m->comm_bytes.insert(req.comm_bytes().begin(), req.comm_bytes().end());
  }
  if (new_step) Broadcast(*job, v1::JobEvent::STEP, req.rank(), "", now);
  v1::HeartbeatResponse resp;
  resp.set_generation(job->generation);
  resp.set_job_state(job->state);
  for (int64_t r : job->slots.lost()) resp.add_lost_ranks(r);
  resp.set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  return resp;
}

void JobRegistry::ExpireLeases(absl::Duration unheard) {
  const absl::Time now = clock_->Now();
  unheard = std::max(unheard, absl::ZeroDuration());
  for (const std::shared_ptr<Job>& job : AllJobs()) {
    std::vector<KvOp> ops;
    {
      MutexLock lock(&job->mu);
      std::vector<int64_t> lost;
      for (int64_t r = 0; r < job->world_size; ++r) {
        std::optional<Member>& m = job->members[static_cast<size_t>(r)];
        if (!m.has_value() || m->state != v1::MEMBER_ACTIVE) continue;
        m->lease_expiry += unheard;
        if (m->lease_expiry >= now) continue;
        m->state = v1::MEMBER_LOST;
        job->slots.MarkLost(r);
        lost.push_back(r);
        ops.push_back(KvOp::Put(MemberKey(job->id, r), EncodeMember(*m)));
      }
      if (lost.empty()) continue;
      ++job->generation;
      job->state = v1::JOB_DEGRADED;
      ops.push_back(KvOp::Put(MetaKey(job->id), EncodeMeta(*job, job->generation, job->state)));
      for (int64_t r : lost) {
        Broadcast(*job, v1::JobEvent::MEMBER_LOST, r,
                  absl::StrCat("rank ", r, " sent no heartbeat for ",
                               absl::FormatDuration(options_.lease_ttl), "; generation ",
                               job->generation),
                  now);
      }
    }
    kv_->Commit(std::move(ops), [](absl::StatusOr<CommitResult>) {});
  }
}

void JobRegistry::Leave(const std::string& job_id, int64_t rank,
                        std::function<void(absl::StatusOr<int64_t>)> done) {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return done(JobNotFound(job_id));
  Deferred deferred;
  std::vector<KvOp> ops;
  int64_t generation = 0;
  {
    MutexLock lock(&job->mu);
    std::optional<Member>* m =
        rank >= 0 && rank < job->world_size ? &job->members[static_cast<size_t>(rank)] : nullptr;
    if (m == nullptr || !IsLive(*m)) {
      deferred.push_back(
          [done, status = absl::FailedPreconditionError(absl::StrCat(
                     "job ", job_id, ": rank ", rank, " is not a live member"))] { done(status); });
    } else if ((*m)->state == v1::MEMBER_JOINING) {
      deferred.push_back([waiter = std::move((*m)->waiter)] {
        waiter(absl::CancelledError("left before the job formed"));
      });
      m->reset();
      job->slots.Free(rank);
      deferred.push_back([done, generation = job->generation] { done(generation); });
    } else {
      (*m)->state = v1::MEMBER_LEFT;
      job->slots.Free(rank);
      ++job->generation;
      job->state = job->slots.live() == 0 ? v1::JOB_ENDED : v1::JOB_DEGRADED;
      generation = job->generation;
      ops.push_back(KvOp::Put(MemberKey(job_id, rank), EncodeMember(**m)));
      ops.push_back(KvOp::Put(MetaKey(job_id), EncodeMeta(*job, job->generation, job->state)));
      if (job->state == v1::JOB_ENDED) ops.push_back(KvOp::DeletePrefix(StoreKeyPrefix(job_id)));
      const absl::Time now = clock_->Now();
      Broadcast(*job, v1::JobEvent::MEMBER_LEFT, rank, absl::StrCat("rank ", rank, " left"), now);
      if (job->state == v1::JOB_ENDED) {
        Broadcast(*job, v1::JobEvent::JOB_ENDED, -1, "every rank left", now);
      }
    }
  }
  RunAll(deferred);
  if (!ops.empty()) {
    kv_->Commit(std::move(ops), [done, generation](absl::StatusOr<CommitResult> r) {
      if (!r.ok()) return done(r.status());
      done(generation);
    });
  }
}

void JobRegistry::EndJob(const std::string& job_id, std::function<void(absl::Status)> done) {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return done(JobNotFound(job_id));
  Deferred deferred;
  std::vector<KvOp> ops;
  {
    MutexLock lock(&job->mu);
    FailJoining(*job, absl::FailedPreconditionError(absl::StrCat("job ", job_id, " was ended")),
                deferred);
    for (int64_t r = 0; r < job->world_size; ++r) {
      std::optional<Member>& m = job->members[static_cast<size_t>(r)];
      if (!m.has_value() || m->state != v1::MEMBER_ACTIVE) continue;
      m->state = v1::MEMBER_LEFT;
      job->slots.Free(r);
      ops.push_back(KvOp::Put(MemberKey(job_id, r), EncodeMember(*m)));
    }
    job->state = v1::JOB_ENDED;
    ops.push_back(KvOp::Put(MetaKey(job_id), EncodeMeta(*job, job->generation, job->state)));
    ops.push_back(KvOp::DeletePrefix(StoreKeyPrefix(job_id)));
    Broadcast(*job, v1::JobEvent::JOB_ENDED, -1, "ended by request", clock_->Now());
    for (auto& [id, sink] : job->watchers) sink->Close(absl::OkStatus());
    job->watchers.clear();
  }
  RunAll(deferred);
  kv_->Commit(std::move(ops), [done](absl::StatusOr<CommitResult> r) {
    done(r.ok() ? absl::OkStatus() : r.status());
  });
}

absl::StatusOr<int64_t> JobRegistry::Subscribe(const std::string& job_id,
                                               std::shared_ptr<EventSink> sink) {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return JobNotFound(job_id);
  int64_t id = 0;
  {
    MutexLock lock(&jobs_mu_);
    id = next_watch_id_++;
  }
  MutexLock lock(&job->mu);
  job->watchers[id] = sink;
  v1::JobEvent snapshot;
  snapshot.set_kind(v1::JobEvent::SNAPSHOT);
  snapshot.set_job_id(job_id);
  snapshot.set_generation(job->generation);
  snapshot.set_job_state(job->state);
  snapshot.set_rank(-1);
  snapshot.set_message(absl::StrCat(job->slots.live(), " of ", job->world_size, " ranks live"));
  snapshot.set_unix_ms(absl::ToUnixMillis(clock_->Now()));
  sink->Send(snapshot);
  return id;
}

void JobRegistry::Unsubscribe(const std::string& job_id, int64_t id) {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return;
  MutexLock lock(&job->mu);
  job->watchers.erase(id);
}

void JobRegistry::Shutdown() {
  const absl::Status status = absl::UnavailableError("zerod is shutting down; retry");
  for (const std::shared_ptr<Job>& job : AllJobs()) {
    Deferred deferred;
    {
      MutexLock lock(&job->mu);
      FailJoining(*job, status, deferred);
      for (auto& [id, sink] : job->watchers) sink->Close(status);
      job->watchers.clear();
    }
    RunAll(deferred);
  }
}

}  // namespace zerod::server
