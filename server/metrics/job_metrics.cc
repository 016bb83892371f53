#include "server/metrics/job_metrics.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/state_names.h"
#include "server/job.h"
#include "server/metrics/registry.h"
#include "server/metrics/server_metrics.h"

namespace zerod::metrics {
namespace {

using proto::JobStateName;

// One family's samples, gathered across jobs before it is written whole.
struct Collected {
  const char* name;
  const char* help;
  const char* type;
  std::vector<std::pair<Labels, double>> samples;

  void Add(Labels labels, double value) { samples.emplace_back(std::move(labels), value); }
  void WriteTo(TextWriter& out) const {
    out.Header(name, help, type);
    for (const auto& [labels, value] : samples) out.Sample(name, labels, value);
  }
};

constexpr v1::JobState kJobStates[] = {v1::JOB_FORMING, v1::JOB_RUNNING, v1::JOB_DEGRADED,
                                       v1::JOB_ENDED};
constexpr v1::MemberState kMemberStates[] = {v1::MEMBER_JOINING, v1::MEMBER_ACTIVE, v1::MEMBER_LOST,
                                             v1::MEMBER_LEFT};

}  // namespace

void JobMetrics::Write(TextWriter& out, absl::Time now) {
  Collected jobs{"zerod_jobs", "Jobs the daemon holds, by state.", "gauge", {}};
  Collected ranks{"zerod_job_ranks", "Members of each open job, by state.", "gauge", {}};
  Collected world{"zerod_job_world_size", "Ranks each open job was declared with.", "gauge", {}};
  Collected generation{"zerod_job_generation",
                       "Each open job's generation (moves on when a member is lost or leaves).",
                       "gauge",
                       {}};
  Collected step_max{
      "zerod_job_step_max", "The highest step an active member of the job reported.", "gauge", {}};
  Collected step_min{
      "zerod_job_step_min", "The lowest step an active member of the job reported.", "gauge", {}};
  Collected step_rate{"zerod_job_step_rate",
                      "Steps per second of the job (its highest step, over about 30 s).",
                      "gauge",
                      {}};
  Collected plan_memory{
      "zerod_job_plan_memory_bytes",
      "Bytes the job's shard plan puts on rank 0, by category (ranks differ only in "
      "their split between real and padding).",
      "gauge",
      {}};
  Collected plan_allocated{"zerod_job_plan_allocated_bytes_per_rank",
                           "Bytes per rank the job's shard plan allocates in all.",
                           "gauge",
                           {}};
  Collected memory_max{"zerod_job_memory_bytes_max",
                       "The largest memory an active member reported, by category.",
                       "gauge",
                       {}};
  Collected comm_sum{"zerod_job_comm_sent_bytes_total",
                     "Bytes the job's active members report sent, by collective (summed).",
                     "counter",
                     {}};
  Collected rank_step{
      "zerod_rank_step", "The step each rank last reported (small jobs only).", "gauge", {}};
  Collected rank_memory{"zerod_rank_memory_bytes",
                        "Memory each rank reported, by category (small jobs only).",
                        "gauge",
                        {}};
  Collected rank_budget{"zerod_rank_memory_budget_bytes",
                        "The memory budget each rank declared (small jobs only).",
                        "gauge",
                        {}};
  Collected rank_comm{"zerod_rank_comm_sent_bytes_total",
                      "Bytes each rank reported sent, by collective (small jobs only).",
                      "counter",
                      {}};
  Collected rank_heartbeat{"zerod_rank_last_heartbeat_timestamp_seconds",
                           "When each rank's last heartbeat arrived, Unix time (small jobs only).",
                           "gauge",
                           {}};

  std::map<v1::JobState, int64_t> by_state;
  std::set<std::string> open;
  MutexLock lock(&mu_);
  for (const v1::JobSummary& summary : registry_->ListJobs()) {
    ++by_state[summary.state()];
    if (summary.state() == v1::JOB_ENDED) continue;
    auto described = registry_->Describe(summary.job_id());
    if (!described.ok()) continue;  // gone since it was listed
    const v1::JobDescription& d = *described;
    const std::string& job = summary.job_id();
    open.insert(job);
    world.Add({{"job_id", job}}, static_cast<double>(summary.world_size()));
    generation.Add({{"job_id", job}}, static_cast<double>(summary.generation()));

    std::map<v1::MemberState, int64_t> members;
    std::optional<int64_t> lowest, highest;
    std::map<std::string, int64_t> memory, comm;
    const bool per_rank = summary.world_size() <= options_.max_ranks_per_job;
    for (const v1::Member& m : d.members()) {
      ++members[m.state()];
      if (m.state() != v1::MEMBER_ACTIVE) continue;
      lowest = std::min(lowest.value_or(m.step()), m.step());
      highest = std::max(highest.value_or(m.step()), m.step());
      for (const auto& [category, bytes] : m.memory_bytes()) {
        memory[category] = std::max(memory[category], bytes);
      }
      for (const auto& [collective, bytes] : m.comm_bytes()) comm[collective] += bytes;
      if (!per_rank) continue;
      const std::string rank = absl::StrCat(m.rank());
      rank_step.Add({{"job_id", job}, {"rank", rank}}, static_cast<double>(m.step()));
      rank_budget.Add({{"job_id", job}, {"rank", rank}}, static_cast<double>(m.budget_bytes()));
      if (m.last_heartbeat_unix_ms() > 0) {
        rank_heartbeat.Add({{"job_id", job}, {"rank", rank}},
                           static_cast<double>(m.last_heartbeat_unix_ms()) / 1000);
      }
      // Sorted, so the exposition is stable from scrape to scrape.
      const std::map<std::string, int64_t> rank_memory_sorted(m.memory_bytes().begin(),
                                                              m.memory_bytes().end());
      for (const auto& [category, bytes] : rank_memory_sorted) {
        rank_memory.Add({{"job_id", job}, {"rank", rank}, {"category", category}},
                        static_cast<double>(bytes));
      }
      const std::map<std::string, int64_t> rank_comm_sorted(m.comm_bytes().begin(),
                                                            m.comm_bytes().end());
      for (const auto& [collective, bytes] : rank_comm_sorted) {
        rank_comm.Add({{"job_id", job}, {"rank", rank}, {"collective", collective}},
                      static_cast<double>(bytes));
      }
    }
    for (v1::MemberState state : kMemberStates) {
      ranks.Add({{"job_id", job}, {"state", server::MemberStateName(state)}},
                static_cast<double>(members[state]));
    }
    if (highest.has_value()) {
      step_max.Add({{"job_id", job}}, static_cast<double>(*highest));
      step_min.Add({{"job_id", job}}, static_cast<double>(*lowest));
      if (std::optional<double> rate = step_rate_.Update(job, *highest, now)) {
        step_rate.Add({{"job_id", job}}, *rate);
      }
    }
    const std::map<std::string, int64_t> plan_sorted(d.plan_memory_bytes().begin(),
                                                     d.plan_memory_bytes().end());
    for (const auto& [category, bytes] : plan_sorted) {
      plan_memory.Add({{"job_id", job}, {"category", category}}, static_cast<double>(bytes));
    }
    if (d.plan_allocated_bytes_per_rank() > 0) {
      plan_allocated.Add({{"job_id", job}}, static_cast<double>(d.plan_allocated_bytes_per_rank()));
    }
    // Ranks report a handful of categories each (kMaxReportEntries at most); the union over a
    // job's ranks is bounded the same way.
    int written = 0;
    for (const auto& [category, bytes] : memory) {
      if (++written > server::kMaxReportEntries) break;
      memory_max.Add({{"job_id", job}, {"category", category}}, static_cast<double>(bytes));
    }
    written = 0;
    for (const auto& [collective, bytes] : comm) {
      if (++written > server::kMaxReportEntries) break;
      comm_sum.Add({{"job_id", job}, {"collective", collective}}, static_cast<double>(bytes));
    }
  }
  for (v1::JobState state : kJobStates) {
    jobs.Add({{"state", JobStateName(state)}}, static_cast<double>(by_state[state]));
  }
  step_rate_.Retain(open);
  // The counters kept per job elsewhere go with the job.
  const auto gone = [&open](const std::vector<std::string>& labels) {
    return !open.contains(labels[0]);
  };
  const ServerMetrics& counted = Metrics();
  counted.joins.RemoveIf(gone);
  counted.losses.RemoveIf(gone);
  counted.heartbeats.RemoveIf(gone);

  for (const Collected* family :
       {&jobs, &ranks, &world, &generation, &step_max, &step_min, &step_rate, &plan_memory,
        &plan_allocated, &memory_max, &comm_sum, &rank_step, &rank_memory, &rank_budget, &rank_comm,
        &rank_heartbeat}) {
    family->WriteTo(out);
  }
}

std::string ScrapeAll(JobMetrics* jobs, absl::Time now) {
  TextWriter out;
  if (jobs != nullptr) jobs->Write(out, now);  // first: it drops the series of ended jobs
  DefaultRegistry().Write(out);
  return out.Take();
}

}  // namespace zerod::metrics
