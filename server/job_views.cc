// JobRegistry's read-only views for the Inspect service.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/job_registry.h"

namespace zerod::server {
namespace {

v1::JobSummary Summarize(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  v1::JobSummary s;
  s.set_job_id(job.id);
  s.set_state(job.state);
  s.set_world_size(job.world_size);
  s.set_generation(job.generation);
  int64_t active = 0;
  for (const auto& [rank, m] : job.members) {
    if (m.state == v1::MEMBER_ACTIVE) ++active;
  }
  s.set_active_members(active);
  s.set_stage(job.plan.has_value() ? job.plan->options().stage() : -1);
  s.set_params(job.shard_plan ? job.shard_plan->total_numel() : 0);
  return s;
}

}  // namespace

std::vector<v1::JobSummary> JobRegistry::ListJobs() const {
  std::vector<v1::JobSummary> out;
  for (const std::shared_ptr<Job>& job : AllJobs()) {
    MutexLock lock(&job->mu);
    if (job->world_size == 0) continue;  // created by a join that was refused
    out.push_back(Summarize(*job));
  }
  std::sort(out.begin(), out.end(), [](const v1::JobSummary& a, const v1::JobSummary& b) {
    return a.job_id() < b.job_id();
  });
  return out;
}

absl::StatusOr<v1::JobDescription> JobRegistry::Describe(const std::string& job_id) const {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return Missing(job_id);
  MutexLock lock(&job->mu);
  v1::JobDescription d;
  *d.mutable_summary() = Summarize(*job);
  // The members that joined, never the world they declared.
  for (const auto& [r, m] : job->members) {
    v1::Member* out = d.add_members();
    out->set_rank(r);
    out->set_state(m.state);
    out->set_host(m.host);
    out->set_device(m.device);
    out->set_budget_bytes(m.budget_bytes);
    out->set_last_heartbeat_unix_ms(m.last_heartbeat_unix_ms);
    out->set_step(m.step);
    out->mutable_memory_bytes()->insert(m.memory_bytes.begin(), m.memory_bytes.end());
    out->mutable_comm_bytes()->insert(m.comm_bytes.begin(), m.comm_bytes.end());
    out->set_generation(m.generation);
  }
  if (job->shard_plan) {
    const plan::MemoryBreakdown memory = job->shard_plan->MemoryForRank(0);
    for (int c = 0; c < plan::kMemoryCategoryCount; ++c) {
      const auto category = static_cast<plan::MemoryCategory>(c);
      (*d.mutable_plan_memory_bytes())[std::string(plan::MemoryCategoryName(category))] =
          memory[category];
    }
    d.set_plan_allocated_bytes_per_rank(job->shard_plan->AllocatedBytesPerRank());
    d.set_plan_digest(job->shard_plan->DigestHex());
  }
  d.set_lease_ttl_ms(absl::ToInt64Milliseconds(options_.lease_ttl));
  return d;
}

absl::StatusOr<std::shared_ptr<const plan::ShardPlan>> JobRegistry::ShardPlanOf(
    const std::string& job_id) const {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return Missing(job_id);
  MutexLock lock(&job->mu);
  if (!job->shard_plan) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job_id,
                                                      " has no plan yet: ", job->slots.live(),
                                                      " of ", job->world_size, " ranks joined"));
  }
  return job->shard_plan;
}

}  // namespace zerod::server
