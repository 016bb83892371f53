#include "server/job_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/plan_convert.h"
#include "runtime/plan/digest.h"
#include "server/job_records.h"
#include "server/logging.h"

namespace zerod::server {
namespace {

using Deferred = std::vector<std::function<void()>>;

void RunAll(Deferred& deferred) {
  for (auto& f : deferred) f();
}

bool IsLive(const std::optional<Member>& m) {
  return m.has_value() && (m->state == v1::MEMBER_ACTIVE || m->state == v1::MEMBER_JOINING);
}

const char* StateName(v1::MemberState s) {
  switch (s) {
    case v1::MEMBER_JOINING:
      return "joining";
    case v1::MEMBER_ACTIVE:
      return "active";
    case v1::MEMBER_LOST:
      return "lost";
    case v1::MEMBER_LEFT:
      return "left";
    default:
      return "unknown";
  }
}

std::string Short(const std::string& digest) { return digest.substr(0, 8) + ".."; }

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

// Frees a rank's slot for later joiners.
void FreeSlot(Job& job, int64_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  job.freed_ranks.insert(rank);
  --job.live_members;
}

// Takes `rank` (>= 0) out of the free bookkeeping.
void TakeSlot(Job& job, int64_t rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  if (rank >= job.next_unused_rank) {
    for (int64_t r = job.next_unused_rank; r < rank; ++r) job.freed_ranks.insert(r);
    job.next_unused_rank = rank + 1;
  } else {
    job.freed_ranks.erase(rank);
  }
  job.lost_ranks.erase(rank);
}

std::string MissingRanks(const Job& job) ABSL_SHARED_LOCKS_REQUIRED(job.mu) {
  std::vector<int64_t> missing;
  for (int64_t r = 0; r < job.world_size && missing.size() < 8; ++r) {
    if (!IsLive(job.members[static_cast<size_t>(r)])) missing.push_back(r);
  }
  std::string out = absl::StrJoin(missing, ", ");
  if (job.world_size - job.live_members > static_cast<int64_t>(missing.size())) out += ", ...";
  return out;
}

// Fails every waiting join with `status` and frees their slots.
void FailJoining(Job& job, const absl::Status& status, Deferred& deferred)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  for (int64_t r = 0; r < job.world_size; ++r) {
    std::optional<Member>& m = job.members[static_cast<size_t>(r)];
    if (!m.has_value() || m->state != v1::MEMBER_JOINING) continue;
    deferred.push_back([waiter = std::move(m->waiter), status] { waiter(status); });
    m.reset();
    FreeSlot(job, r);
  }
}

JoinResult ResultFor(const Job& job, int64_t rank, absl::Duration ttl)
    ABSL_SHARED_LOCKS_REQUIRED(job.mu) {
  return {rank, job.generation, job.world_size, ttl, job.plan_bytes};
}

}  // namespace

absl::Status JobNotFound(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
}

absl::Status ValidateJobId(const std::string& job_id) {
  if (job_id.empty()) return absl::InvalidArgumentError("job id is empty");
  if (job_id.size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("job id '", job_id.substr(0, 32), "...' is longer than 128 characters"));
  }
  for (char c : job_id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("job id '", job_id, "' has a character outside [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

JobRegistry::JobRegistry(KvStore* kv, const Clock* clock, RegistryOptions options)
    : kv_(kv), clock_(clock), options_(options) {}

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
  absl::MutexLock lock(&jobs_mu_);
  for (const auto& [id, job_records] : by_job) {
    auto job = DecodeJob(id, job_records, lease_expiry);
    if (!job.ok()) return job.status();
    jobs_[id] = *std::move(job);
  }
  return absl::OkStatus();
}

std::shared_ptr<Job> JobRegistry::Find(const std::string& job_id) const {
  absl::ReaderMutexLock lock(&jobs_mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

bool JobRegistry::JobExists(const std::string& job_id) const { return Find(job_id) != nullptr; }

void JobRegistry::Join(JoinArgs a, absl::Time deadline, JoinCallback done) {
  if (absl::Status s = ValidateJobId(a.job_id); !s.ok()) return done(s);
  const std::string who =
      absl::StrCat("job ", a.job_id, ": rank ", a.rank < 0 ? "any" : absl::StrCat(a.rank));
  if (a.world_size < 1 || a.world_size > (int64_t{1} << 24)) {
    return done(absl::InvalidArgumentError(
        absl::StrCat(who, ": world size must be 1..16777216, got ", a.world_size)));
  }
  if (a.rank < -1 || a.rank >= a.world_size) {
    return done(absl::InvalidArgumentError(absl::StrCat(
        "job ", a.job_id, ": rank ", a.rank, " is out of range for world size ", a.world_size)));
  }
  if (a.layout_digest.empty()) {
    return done(absl::InvalidArgumentError(absl::StrCat(who, ": no layout digest")));
  }
  if (!a.layout.empty()) {
    google::protobuf::RepeatedPtrField<v1::TensorSpec> wire(a.layout.begin(), a.layout.end());
    const std::string actual = plan::DigestHex(plan::LayoutDigest(rpc::FromProto(wire)));
    if (actual != a.layout_digest) {
      return done(absl::InvalidArgumentError(absl::StrCat(
          who, ": layout digest ", a.layout_digest, " does not match its layout (", actual, ")")));
    }
  }
  std::shared_ptr<Job> job;
  {
    absl::MutexLock lock(&jobs_mu_);
    std::shared_ptr<Job>& slot = jobs_[a.job_id];
    if (!slot) slot = std::make_shared<Job>(a.job_id);
    job = slot;
  }
  Deferred deferred;
  {
    absl::MutexLock lock(&job->mu);
    if (job->forming) {
      deferred.push_back([done, id = a.job_id] {
        done(absl::UnavailableError(absl::StrCat("job ", id, " is storing its plan; retry")));
      });
    } else {
      const bool fresh = job->live_members == 0;
      absl::Status refused;
      if (fresh) {
        // Nobody is live: the job (re)starts with this rank's world size, layout and options.
        job->world_size = a.world_size;
        job->members.assign(static_cast<size_t>(a.world_size), std::nullopt);
        job->next_unused_rank = 0;
        job->freed_ranks.clear();
        job->lost_ranks.clear();
        job->options = a.options;
        job->layout_digest = a.layout_digest;
        job->layout = a.layout;
        job->state = v1::JOB_FORMING;
        job->plan.reset();
        job->shard_plan.reset();
      } else if (a.world_size != job->world_size) {
        refused = absl::FailedPreconditionError(absl::StrCat(
            "job ", a.job_id, " has world size ", job->world_size, "; rank ",
            a.rank < 0 ? "any" : absl::StrCat(a.rank), " asked for ", a.world_size,
            " (end the job, or let every rank leave, to re-form it with another size)"));
      } else if (a.layout_digest != job->layout_digest) {
        refused = absl::FailedPreconditionError(
            absl::StrCat(who, " layout digest ", Short(a.layout_digest), " differs from rank ",
                         job->layout_digest_rank, " (", Short(job->layout_digest), ")"));
      }
      int64_t rank = a.rank;
      bool replace_live = false;
      if (refused.ok() && rank >= 0) {
        std::optional<Member>& m = job->members[static_cast<size_t>(rank)];
        if (IsLive(m)) {
          const bool same_process = m->host == a.host && m->device == a.device;
          if (!same_process) {
            refused = absl::AlreadyExistsError(
                absl::StrCat("job ", a.job_id, ": rank ", rank, " is held by host '", m->host,
                             "' device '", m->device, "' (", StateName(m->state), ")"));
          } else if (m->state == v1::MEMBER_ACTIVE && job->plan.has_value() &&
                     job->state == v1::JOB_RUNNING) {
            // A retry after the answer was lost (daemon restart): answer again.
            deferred.push_back([done, r = ResultFor(*job, rank, options_.lease_ttl)] { done(r); });
            refused = absl::CancelledError("answered");
          } else if (m->state == v1::MEMBER_JOINING) {
            deferred.push_back([waiter = std::move(m->waiter)] {
              waiter(absl::AbortedError("superseded by a retry of the same rank"));
            });
            replace_live = true;
          } else {
            refused = absl::AlreadyExistsError(absl::StrCat("job ", a.job_id, ": rank ", rank,
                                                            " is already active in generation ",
                                                            job->generation));
          }
        }
      } else if (refused.ok()) {
        if (!job->freed_ranks.empty()) {
          rank = *job->freed_ranks.begin();
        } else if (job->next_unused_rank < job->world_size) {
          rank = job->next_unused_rank;
        } else {
          refused = absl::AlreadyExistsError(absl::StrCat("job ", a.job_id,
                                                          " is full: ", job->live_members, " of ",
                                                          job->world_size, " ranks are live"));
        }
      }
      if (!refused.ok()) {
        if (refused.code() != absl::StatusCode::kCancelled) {
          deferred.push_back([done, refused] { done(refused); });
        }
      } else {
        if (!replace_live) {
          TakeSlot(*job, rank);
          ++job->live_members;
        }
        if (fresh) job->layout_digest_rank = rank;
        if (job->layout.empty() && !a.layout.empty()) job->layout = a.layout;
        Member m;
        m.state = v1::MEMBER_JOINING;
        m.host = a.host;
        m.device = a.device;
        m.budget_bytes = a.budget_bytes;
        m.layout_digest = a.layout_digest;
        m.generation = job->generation;
        m.ticket = job->next_ticket++;
        m.waiter = std::move(done);
        const int64_t ticket = m.ticket;
        job->members[static_cast<size_t>(rank)] = std::move(m);
        Broadcast(*job, v1::JobEvent::MEMBER_JOINED, rank,
                  absl::StrCat(job->live_members, " of ", job->world_size, " ranks joined"),
                  clock_->Now());
        timers_.Schedule(deadline, [this, job, rank, ticket] { JoinTimedOut(job, rank, ticket); });
        if (job->live_members == job->world_size) StartFormation(job, deferred);
      }
    }
  }
  RunAll(deferred);
}

void JobRegistry::JoinTimedOut(const std::shared_ptr<Job>& job, int64_t rank, int64_t ticket) {
  Deferred deferred;
  {
    absl::MutexLock lock(&job->mu);
    if (job->forming || rank >= job->world_size) return;
    std::optional<Member>& m = job->members[static_cast<size_t>(rank)];
    if (!m.has_value() || m->state != v1::MEMBER_JOINING || m->ticket != ticket) return;
    const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
        "job ", job->id, ": rank ", rank, " waited until its deadline; ", job->live_members, " of ",
        job->world_size, " ranks joined (missing: ", MissingRanks(*job), ")"));
    deferred.push_back([waiter = std::move(m->waiter), status] { waiter(status); });
    m.reset();
    FreeSlot(*job, rank);
  }
  RunAll(deferred);
}

void JobRegistry::StartFormation(const std::shared_ptr<Job>& job, Deferred& deferred) {
  const std::string prefix = absl::StrCat("job ", job->id, ": ");
  if (job->layout.empty()) {
    FailJoining(*job, absl::FailedPreconditionError(prefix + "no rank sent the parameter layout"),
                deferred);
    return;
  }
  plan::PlanInput input;
  google::protobuf::RepeatedPtrField<v1::TensorSpec> wire(job->layout.begin(), job->layout.end());
  input.tensors = rpc::FromProto(wire);
  input.options = rpc::FromProto(job->options);
  input.options.world_size = job->world_size;
  int64_t budget = 0;
  for (const std::optional<Member>& m : job->members) {
    if (IsLive(m) && m->budget_bytes > 0 && (budget == 0 || m->budget_bytes < budget)) {
      budget = m->budget_bytes;
    }
  }
  if (budget > 0) input.options.budget_bytes = budget;
  auto shard_plan = plan::ShardPlan::Create(std::move(input));
  if (!shard_plan.ok()) {
    FailJoining(*job,
                absl::Status(shard_plan.status().code(),
                             prefix + std::string(shard_plan.status().message())),
                deferred);
    return;
  }
  v1::PlanInputs inputs;
  *inputs.mutable_tensors() = wire;
  inputs.set_world_size(job->world_size);
  *inputs.mutable_options() = rpc::ToProto(shard_plan->options());
  inputs.set_plan_digest(shard_plan->DigestHex());
  inputs.set_layout_digest(job->layout_digest);
  inputs.set_generation(job->generation + 1);
  inputs.set_allocated_bytes_per_rank(shard_plan->AllocatedBytesPerRank());
  inputs.set_budget_bytes(budget);

  std::vector<KvOp> ops;
  ops.push_back(
      KvOp::Put(MetaKey(job->id), EncodeMeta(*job, inputs.generation(), v1::JOB_RUNNING)));
  ops.push_back(KvOp::Put(PlanKey(job->id), inputs.SerializeAsString()));
  ops.push_back(KvOp::DeletePrefix(MembersPrefix(job->id)));
  for (int64_t r = 0; r < job->world_size; ++r) {
    const std::optional<Member>& m = job->members[static_cast<size_t>(r)];
    if (!m.has_value()) continue;
    Member stored = *m;
    if (stored.state == v1::MEMBER_JOINING) {
      stored.state = v1::MEMBER_ACTIVE;
      stored.generation = inputs.generation();
    }
    ops.push_back(KvOp::Put(MemberKey(job->id, r), EncodeMember(stored)));
  }
  job->forming = true;
  job->formation_started = absl::Now();
  auto plan_ptr = std::make_shared<const plan::ShardPlan>(*std::move(shard_plan));
  deferred.push_back(
      [this, job, ops = std::move(ops), inputs = std::move(inputs), plan_ptr]() mutable {
        kv_->Commit(std::move(ops), [this, job, inputs = std::move(inputs),
                                     plan_ptr](absl::StatusOr<CommitResult> r) mutable {
          FinishFormation(job, r.status(), std::move(inputs), plan_ptr);
        });
      });
}

void JobRegistry::FinishFormation(const std::shared_ptr<Job>& job, absl::Status committed,
                                  v1::PlanInputs inputs,
                                  std::shared_ptr<const plan::ShardPlan> plan) {
  Deferred deferred;
  {
    absl::MutexLock lock(&job->mu);
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
                 job->plan->plan_digest(),
                 absl::FormatDuration(absl::Now() - job->formation_started));
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
  absl::MutexLock lock(&job->mu);
  if (!job->plan.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id,
                                                      " has no plan yet: ", job->live_members,
                                                      " of ", job->world_size, " ranks joined"));
  }
  return *job->plan;
}

absl::StatusOr<v1::HeartbeatResponse> JobRegistry::Heartbeat(const v1::HeartbeatRequest& req) {
  std::shared_ptr<Job> job = Find(req.job_id());
  if (!job) return JobNotFound(req.job_id());
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&job->mu);
  if (req.rank() < 0 || req.rank() >= job->world_size) {
    return absl::InvalidArgumentError(absl::StrCat("job ", job->id, ": rank ", req.rank(),
                                                   " is out of range for world size ",
                                                   job->world_size));
  }
  std::optional<Member>& m = job->members[static_cast<size_t>(req.rank())];
  if (!m.has_value() || m->state != v1::MEMBER_ACTIVE) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job->id, ": rank ", req.rank(), " is not an active member (",
                     m.has_value() ? StateName(m->state) : "never joined", "); generation is ",
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
  for (int64_t r : job->lost_ranks) resp.add_lost_ranks(r);
  resp.set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  return resp;
}

void JobRegistry::ExpireLeases() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::ReaderMutexLock lock(&jobs_mu_);
    for (const auto& [id, job] : jobs_) jobs.push_back(job);
  }
  const absl::Time now = clock_->Now();
  for (const std::shared_ptr<Job>& job : jobs) {
    std::vector<KvOp> ops;
    {
      absl::MutexLock lock(&job->mu);
      std::vector<int64_t> lost;
      for (int64_t r = 0; r < job->world_size; ++r) {
        std::optional<Member>& m = job->members[static_cast<size_t>(r)];
        if (!m.has_value() || m->state != v1::MEMBER_ACTIVE || m->lease_expiry >= now) continue;
        m->state = v1::MEMBER_LOST;
        FreeSlot(*job, r);
        job->lost_ranks.insert(r);
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
    absl::MutexLock lock(&job->mu);
    std::optional<Member>* m =
        rank >= 0 && rank < job->world_size ? &job->members[static_cast<size_t>(rank)] : nullptr;
    if (m == nullptr || !IsLive(*m)) {
      return done(absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, ": rank ", rank, " is not a live member")));
    }
    if ((*m)->state == v1::MEMBER_JOINING) {
      deferred.push_back([waiter = std::move((*m)->waiter)] {
        waiter(absl::CancelledError("left before the job formed"));
      });
      m->reset();
      FreeSlot(*job, rank);
      generation = job->generation;
      deferred.push_back([done, generation] { done(generation); });
    } else {
      (*m)->state = v1::MEMBER_LEFT;
      FreeSlot(*job, rank);
      ++job->generation;
      job->state = job->live_members == 0 ? v1::JOB_ENDED : v1::JOB_DEGRADED;
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
    absl::MutexLock lock(&job->mu);
    FailJoining(*job, absl::FailedPreconditionError(absl::StrCat("job ", job_id, " was ended")),
                deferred);
    for (int64_t r = 0; r < job->world_size; ++r) {
      std::optional<Member>& m = job->members[static_cast<size_t>(r)];
      if (!m.has_value() || m->state != v1::MEMBER_ACTIVE) continue;
      m->state = v1::MEMBER_LEFT;
      FreeSlot(*job, r);
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
    absl::MutexLock lock(&jobs_mu_);
    id = next_watch_id_++;
  }
  absl::MutexLock lock(&job->mu);
  job->watchers[id] = sink;
  v1::JobEvent snapshot;
  snapshot.set_kind(v1::JobEvent::SNAPSHOT);
  snapshot.set_job_id(job_id);
  snapshot.set_generation(job->generation);
  snapshot.set_job_state(job->state);
  snapshot.set_rank(-1);
  snapshot.set_message(absl::StrCat(job->live_members, " of ", job->world_size, " ranks live"));
  snapshot.set_unix_ms(absl::ToUnixMillis(clock_->Now()));
  sink->Send(snapshot);
  return id;
}

void JobRegistry::Unsubscribe(const std::string& job_id, int64_t id) {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return;
  absl::MutexLock lock(&job->mu);
  job->watchers.erase(id);
}

void JobRegistry::Shutdown() {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    absl::ReaderMutexLock lock(&jobs_mu_);
    for (const auto& [id, job] : jobs_) jobs.push_back(job);
  }
  const absl::Status status = absl::UnavailableError("zerod is shutting down; retry");
  for (const std::shared_ptr<Job>& job : jobs) {
    Deferred deferred;
    {
      absl::MutexLock lock(&job->mu);
      FailJoining(*job, status, deferred);
      for (auto& [id, sink] : job->watchers) sink->Close(status);
      job->watchers.clear();
    }
    RunAll(deferred);
  }
}

}  // namespace zerod::server
