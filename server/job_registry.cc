#include "server/job_registry.h"

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <variant>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/job_records.h"
#include "server/join_admission.h"
#include "server/logging.h"
#include "server/metrics/server_metrics.h"
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
  // Losses, leaves and ends are what an operator looks for in the log; joins and steps are many.
  if (kind == v1::JobEvent::MEMBER_LOST || kind == v1::JobEvent::MEMBER_LEFT ||
      kind == v1::JobEvent::JOB_ENDED) {
    LogAboutJob(*Logger("coordinator"),
                kind == v1::JobEvent::MEMBER_LOST ? spdlog::level::warn : spdlog::level::info,
                {job.id, rank, job.generation}, "{}", message);
  }
  if (job.watchers.empty()) return;
  v1::JobEvent e;
  e.set_kind(kind);
  e.set_job_id(job.id);
  e.set_generation(job.generation);
  e.set_job_state(job.state);
  e.set_rank(rank);
  if (const Member* m = MemberAt(job, rank); m != nullptr) e.set_step(m->step);
  e.set_message(std::move(message));
  e.set_unix_ms(absl::ToUnixMillis(now));
  for (auto& [id, sink] : job.watchers) sink->Send(e);
}

// Tells the job's watchers it ended, saying why, and closes their streams.
void AnnounceEnd(Job& job, std::string message, absl::Time now)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  Broadcast(job, v1::JobEvent::JOB_ENDED, -1, std::move(message), now);
  for (auto& [id, sink] : job.watchers) sink->Close(absl::OkStatus());
  job.watchers.clear();
}

std::string MissingRanks(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  std::vector<int64_t> missing;
  // Looks at no more ranks than have joined, plus the eight it names.
  for (int64_t r = 0; r < job.world_size && missing.size() < 8; ++r) {
    const Member* m = MemberAt(job, r);
    if (m == nullptr || !IsLive(*m)) missing.push_back(r);
  }
  std::string out = absl::StrJoin(missing, ", ");
  if (job.world_size - job.slots.live() > static_cast<int64_t>(missing.size())) out += ", ...";
  return out;
}

// Members changed: the next heartbeat lists the ranks that left afresh (Job::left_ranks).
void ForgetLeftRanks(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) { job.left_ranks.reset(); }

// Fails every waiting join with `status` and frees their slots.
void FailJoining(Job& job, const absl::Status& status, std::vector<std::function<void()>>& deferred)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  for (auto it = job.members.begin(); it != job.members.end();) {
    if (it->second.state != v1::MEMBER_JOINING) {
      ++it;
      continue;
    }
    deferred.push_back([waiter = std::move(it->second.waiter), status] { waiter(status); });
    job.slots.Free(it->first);
    it = job.members.erase(it);
    ForgetLeftRanks(job);
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
  view.options = &job.options;
  view.layout = job.layout;
  if (rank >= 0) view.holder = MemberAt(job, rank);
  view.lowest_free_rank = job.slots.LowestFree();
  return view;
}

// Open: counted against RegistryOptions::max_jobs. A job opens when its first join enters and
// stays open until it ends (or is removed, never having formed).
bool IsOpen(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  return job.world_size > 0 && job.state != v1::JOB_ENDED && !job.removed;
}

// Why a heartbeat's report cannot be kept, if it cannot: it lives in memory with the member and
// goes out with every DescribeJob.
absl::Status CheckReport(const v1::HeartbeatRequest& req) {
  for (const auto& [field, entries] :
       {std::pair{"memory_bytes", &req.memory_bytes()}, {"comm_bytes", &req.comm_bytes()}}) {
    if (entries->size() > kMaxReportEntries) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", ShownJobId(req.job_id()), ": rank ", req.rank(), ": heartbeat ",
                       field, " has ", entries->size(), " entries, over ", kMaxReportEntries));
    }
    for (const auto& [name, value] : *entries) {
      if (name.size() > kMaxReportNameBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "job ", ShownJobId(req.job_id()), ": rank ", req.rank(), ": heartbeat ", field,
            " entry '", ShownKey(name), "' is longer than ", kMaxReportNameBytes, " bytes"));
      }
    }
  }
  return absl::OkStatus();
}

// Starts the job afresh with the shape of the join that re-forms it.
void Reform(Job& job, const JoinArgs& args) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  job.world_size = args.world_size;
  job.members.clear();
  ForgetLeftRanks(job);
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
  std::map<std::string, std::vector<KeyValue>> by_job;
  for (const KeyValue& kv : kv_->Range("jobs/")) {
    const std::string id = JobOfKey(kv.key);
    // Store keys are served from the KvStore directly; the registry needs the rest.
    if (id.empty() || absl::StartsWith(kv.key, StoreKeyPrefix(id))) continue;
    by_job[id].push_back(kv);
  }
  // One job's bad records must not keep the others from loading: such a job is quarantined.
  std::map<std::string, std::string> bad;  // job -> why
  for (const DamagedRecord& d : kv_->Damaged("jobs/")) {
    const std::string id = JobOfKey(d.key);
    if (!id.empty())
      bad.try_emplace(id, absl::StrCat("record ", d.key, " is damaged (", d.problem, ")"));
  }
  const absl::Time lease_expiry = clock_->Now() + options_.lease_ttl + options_.restart_grace;
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> loaded;
  for (const auto& [id, job_records] : by_job) {
    if (bad.count(id) > 0) continue;
    auto job = DecodeJob(id, job_records, lease_expiry);
    if (job.ok()) {
      loaded[id] = *std::move(job);
    } else {
      bad[id] = absl::StrCat("its records do not decode (", job.status().message(), ")");
    }
  }
  for (const auto& [id, why] : bad) {
    auto [ops, moved_to] = QuarantineRecords(id, kv_->Range(JobPrefix(id)),
                                             kv_->Damaged(JobPrefix(id)), kv_->revision(), why);
    if (auto committed = kv_->CommitSync(std::move(ops)); !committed.ok()) {
      return absl::Status(
          committed.status().code(),
          absl::StrCat("cannot quarantine job ", id, ": ", committed.status().message()));
    }
    LogAboutJob(*Logger("coordinator"), spdlog::level::err, {ShownJobId(id)},
                "quarantined: {}; its records are kept under {}, the other jobs load", why,
                moved_to);
  }
  // Those of earlier starts too, unless the id was joined again since.
  std::map<std::string, std::string> quarantined = QuarantinedJobs(kv_->Range("quarantine/"));
  for (const auto& [id, job] : loaded) quarantined.erase(id);
  MutexLock lock(&jobs_mu_);
  jobs_ = std::move(loaded);
  quarantined_ = std::move(quarantined);
  return absl::OkStatus();
}

absl::Status JobRegistry::Missing(const std::string& job_id) const {
  MutexLock lock(&jobs_mu_);
  if (auto it = quarantined_.find(job_id); it != quarantined_.end()) {
    return absl::DataLossError(absl::StrCat("job ", ShownJobId(job_id), " is quarantined: ",
                                            it->second, ". Joining it again starts a new job"));
  }
  return JobNotFound(job_id);
}

std::shared_ptr<Job> JobRegistry::Find(const std::string& job_id) const {
  MutexLock lock(&jobs_mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

int64_t JobRegistry::OpenJobsExcept(const Job* except) const {
  int64_t open = 0;
  for (const std::shared_ptr<Job>& job : AllJobs()) {
    if (job.get() == except) continue;
    MutexLock lock(&job->mu);
    if (IsOpen(*job)) ++open;
  }
  return open;
}

void JobRegistry::ForgetIfUnformed(const std::shared_ptr<Job>& job, Deferred& deferred) {
  if (job->removed || job->forming || job->state != v1::JOB_FORMING || !job->members.empty()) {
    return;
  }
  if (job->generation != 0) {
    // It formed once, so it has records: a re-formation that came to nothing ends it, durably,
    // rather than leaving it "forming" with nobody in it.
    job->state = v1::JOB_ENDED;
    std::vector<KvOp> ops;
    ops.push_back(KvOp::Put(MetaKey(job->id), EncodeMeta(*job, job->generation, job->state)));
    ops.push_back(KvOp::DeletePrefix(StoreKeyPrefix(job->id)));
    AnnounceEnd(*job, "every rank that joined is gone before the job re-formed", clock_->Now());
    deferred.push_back([this, ops = std::move(ops)]() mutable {
      kv_->Commit(std::move(ops), [](absl::StatusOr<CommitResult>) {});
    });
    return;
  }
  // It never formed, so nothing of it is stored but keys its ranks set while they waited.
  job->removed = true;
  if (!job->watchers.empty()) {
    job->state = v1::JOB_ENDED;
    AnnounceEnd(*job, "every rank that joined is gone before the job formed; it is removed",
                clock_->Now());
  }
  {
    // Lock order: a job's lock, then jobs_mu_.
    MutexLock lock(&jobs_mu_);
    auto it = jobs_.find(job->id);
    if (it != jobs_.end() && it->second == job) jobs_.erase(it);
  }
  if (job->world_size > 0) {
    deferred.push_back([this, prefix = StoreKeyPrefix(job->id)] {
      kv_->Commit({KvOp::DeletePrefix(prefix)}, [](absl::StatusOr<CommitResult>) {});
    });
  }
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

bool JobRegistry::JobEnded(const std::string& job_id) const {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return false;
  MutexLock lock(&job->mu);
  return job->state == v1::JOB_ENDED;
}

void JobRegistry::Join(JoinArgs args, absl::Time deadline, JoinCallback done) {
  if (absl::Status s = CheckJoinArgs(args, options_.join_limits); !s.ok()) return done(s);
  // Most joins enter a job that is open already. One that would open a job goes round again
  // holding open_mu_, so that the count it checks still holds when it enters.
  Deferred deferred;
  if (!TryJoin(args, deadline, done, /*may_open=*/false, deferred)) {
    MutexLock opening(&open_mu_);
    TryJoin(args, deadline, done, /*may_open=*/true, deferred);
  }
  // Outside every lock, open_mu_ too: an answer may join again.
  RunAll(deferred);
}

bool JobRegistry::TryJoin(JoinArgs& args, absl::Time deadline, JoinCallback& done, bool may_open,
                          Deferred& deferred) {
  for (;;) {
    std::shared_ptr<Job> job = FindOrCreate(args.job_id);
    const int64_t open_elsewhere = may_open ? OpenJobsExcept(job.get()) : 0;
    {
      MutexLock lock(&job->mu);
      if (job->removed) continue;  // a ghost removed since it was found: look again
      JoinDecision decision = DecideJoin(AdmissionView(*job, args.rank), args);
      const auto* enter = std::get_if<AwaitFormation>(&decision);
      if (enter != nullptr && enter->reform && !IsOpen(*job)) {
        if (!may_open) return false;
        if (open_elsewhere >= options_.max_jobs) {
          decision = RefuseJoin{absl::ResourceExhaustedError(
              absl::StrCat("job ", args.job_id, ": zerod has ", open_elsewhere,
                           " open jobs, the most it takes (--max-jobs ", options_.max_jobs,
                           "); end one, or wait for one to end"))};
        }
      }
      std::visit(Overloaded{
                     [&](const RefuseJoin& refuse) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu) {
                       deferred.push_back([done, status = refuse.status] { done(status); });
                       ForgetIfUnformed(job, deferred);
                     },
                     [&](const AnswerAgain& answer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu) {
                       deferred.push_back(
                           [done, result = ResultFor(*job, answer.rank, options_.lease_ttl)] {
                             done(result);
                           });
                     },
                     [&](const AwaitFormation& entered) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job->mu) {
                       Enter(job, std::move(args), entered, deadline, std::move(done), deferred);
                     },
                 },
                 decision);
    }
    return true;
  }
}

void JobRegistry::Enter(const std::shared_ptr<Job>& job, JoinArgs args,
                        const AwaitFormation& decision, absl::Time deadline, JoinCallback done,
                        Deferred& deferred) {
  const int64_t rank = decision.rank;
  if (decision.reform) {
    Reform(*job, args);
    job->layout_digest_rank = rank;
  }
  if (decision.supersede) {
    deferred.push_back([waiter = std::move(MemberAt(*job, rank)->waiter)] {
      waiter(absl::AbortedError("superseded by a retry of the same rank"));
    });
  } else {
    // The admission decision chose a free rank; a taken one here is a broken invariant.
    if (!job->slots.Take(rank)) {
      LogAboutJob(*Logger("coordinator"), spdlog::level::critical, {job->id, rank, job->generation},
                  "admitted rank {} was not free", rank);
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
  job->members[rank] = std::move(m);
  ForgetLeftRanks(*job);
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
    Member* m = MemberAt(*job, rank);
    if (m == nullptr || m->state != v1::MEMBER_JOINING || m->ticket != ticket) return;
    const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
        "job ", job->id, ": rank ", rank, " waited until its deadline; ", job->slots.live(), " of ",
        job->world_size, " ranks joined (missing: ", MissingRanks(*job), ")"));
    deferred.push_back([waiter = std::move(m->waiter), status] { waiter(status); });
    job->members.erase(rank);
    ForgetLeftRanks(*job);
    job->slots.Free(rank);
    ForgetIfUnformed(job, deferred);
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
    ForgetIfUnformed(job, deferred);
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
      ForgetIfUnformed(job, deferred);
    } else {
      job->generation = inputs.generation();
      job->state = v1::JOB_RUNNING;
      job->plan_bytes = std::make_shared<const std::string>(inputs.SerializeAsString());
      job->plan = std::move(inputs);
      job->shard_plan = std::move(plan);
      const absl::Time now = clock_->Now();
      for (auto& [r, m] : job->members) {
        if (m.state != v1::MEMBER_JOINING) continue;
        m.state = v1::MEMBER_ACTIVE;
        m.generation = job->generation;
        // The first lease also covers delivering the plan to every rank (seconds at 100,000).
        m.lease_expiry = now + options_.lease_ttl + options_.restart_grace;
        deferred.push_back([waiter = std::move(m.waiter),
                            result = ResultFor(*job, r, options_.lease_ttl)] { waiter(result); });
      }
      LogAboutJob(*Logger("coordinator"), spdlog::level::info, {job->id, -1, job->generation},
                  "formed: {} ranks, stage {}, plan {}, stored in {}", job->world_size,
                  job->plan->options().stage(), job->plan->plan_digest(),
                  absl::FormatDuration(now - job->formation_started));
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
  if (!job) return Missing(job_id);
  MutexLock lock(&job->mu);
  if (!job->plan.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id,
                                                      " has no plan yet: ", job->slots.live(),
                                                      " of ", job->world_size, " ranks joined"));
  }
  return *job->plan;
}

absl::StatusOr<v1::HeartbeatResponse> JobRegistry::Heartbeat(const v1::HeartbeatRequest& req) {
  if (absl::Status s = CheckReport(req); !s.ok()) return s;
  std::shared_ptr<Job> job = Find(req.job_id());
  if (!job) return Missing(req.job_id());
  const absl::Time now = clock_->Now();
  MutexLock lock(&job->mu);
  if (req.rank() < 0 || req.rank() >= job->world_size) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job->id, ": rank ", req.rank(),
                                                   " is out of range for world size ",
                                                   job->world_size));
  }
  Member* m = MemberAt(*job, req.rank());
  if (m == nullptr || m->state != v1::MEMBER_ACTIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job->id, ": rank ", req.rank(), " is not an active member (",
                     m != nullptr ? MemberStateName(m->state) : "never joined", "); generation is ",
                     job->generation));
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
  if (!job->left_ranks) {
    std::vector<int64_t>& left = job->left_ranks.emplace();
    for (const auto& [r, other] : job->members) {
      if (other.state == v1::MEMBER_LEFT) left.push_back(r);
    }
  }
  resp.mutable_left_ranks()->Add(job->left_ranks->begin(), job->left_ranks->end());
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
      for (auto& [r, m] : job->members) {
        if (m.state != v1::MEMBER_ACTIVE) continue;
        m.lease_expiry += unheard;
        if (m.lease_expiry >= now) continue;
        m.state = v1::MEMBER_LOST;
        job->slots.MarkLost(r);
        lost.push_back(r);
        metrics::Metrics().losses.WithLabels({job->id})->Increment();
        ops.push_back(KvOp::Put(MemberKey(job->id, r), EncodeMember(m)));
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
  if (!job) return done(Missing(job_id));
  Deferred deferred;
  std::vector<KvOp> ops;
  int64_t generation = 0;
  {
    MutexLock lock(&job->mu);
    Member* m = MemberAt(*job, rank);
    if (m == nullptr || !IsLive(*m)) {
      deferred.push_back(
          [done, status = absl::FailedPreconditionError(absl::StrCat(
                     "job ", job_id, ": rank ", rank, " is not a live member"))] { done(status); });
    } else if (m->state == v1::MEMBER_JOINING) {
      deferred.push_back([waiter = std::move(m->waiter)] {
        waiter(absl::CancelledError("left before the job formed"));
      });
      job->members.erase(rank);
      ForgetLeftRanks(*job);
      job->slots.Free(rank);
      deferred.push_back([done, generation = job->generation] { done(generation); });
      ForgetIfUnformed(job, deferred);
    } else {
      m->state = v1::MEMBER_LEFT;
      ForgetLeftRanks(*job);
      job->slots.Free(rank);
      ++job->generation;
      job->state = job->slots.live() == 0 ? v1::JOB_ENDED : v1::JOB_DEGRADED;
      generation = job->generation;
      ops.push_back(KvOp::Put(MemberKey(job_id, rank), EncodeMember(*m)));
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
  if (!job) return done(Missing(job_id));
  Deferred deferred;
  std::vector<KvOp> ops;
  {
    MutexLock lock(&job->mu);
    FailJoining(*job, absl::FailedPreconditionError(absl::StrCat("job ", job_id, " was ended")),
                deferred);
    for (auto& [r, m] : job->members) {
      if (m.state != v1::MEMBER_ACTIVE) continue;
      m.state = v1::MEMBER_LEFT;
      ForgetLeftRanks(*job);
      job->slots.Free(r);
      ops.push_back(KvOp::Put(MemberKey(job_id, r), EncodeMember(m)));
    }
    job->state = v1::JOB_ENDED;
    ops.push_back(KvOp::Put(MetaKey(job_id), EncodeMeta(*job, job->generation, job->state)));
    ops.push_back(KvOp::DeletePrefix(StoreKeyPrefix(job_id)));
    AnnounceEnd(*job, "ended by request", clock_->Now());
  }
  RunAll(deferred);
  kv_->Commit(std::move(ops), [done](absl::StatusOr<CommitResult> r) {
    done(r.ok() ? absl::OkStatus() : r.status());
  });
}

absl::StatusOr<int64_t> JobRegistry::Subscribe(const std::string& job_id,
                                               std::shared_ptr<EventSink> sink) {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return Missing(job_id);
  int64_t id = 0;
  {
    MutexLock lock(&jobs_mu_);
    id = next_watch_id_++;
  }
  MutexLock lock(&job->mu);
  if (job->removed) return JobNotFound(job_id);
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
