#include "server/status/job_history.h"

#include <algorithm>
#include <set>

namespace zerod::status {

std::optional<JobSample> SampleOf(const v1::JobDescription& job, absl::Time now) {
  JobSample s;
  s.time = now;
  s.generation = job.summary().generation();
  bool first = true;
  for (const v1::Member& m : job.members()) {
    if (m.state() != v1::MEMBER_ACTIVE) continue;
    ++s.active_members;
    s.step = first ? m.step() : std::min(s.step, m.step());
    first = false;
    for (const auto& [collective, bytes] : m.comm_bytes()) s.comm_bytes += bytes;
  }
  if (s.active_members == 0) return std::nullopt;
  return s;
}

std::optional<HistoryPoint> PointBetween(const JobSample& before, const JobSample& after) {
  if (before.generation != after.generation || before.active_members != after.active_members ||
      after.step < before.step || after.comm_bytes < before.comm_bytes ||
      after.time <= before.time) {
    return std::nullopt;
  }
  HistoryPoint p;
  p.unix_ms = absl::ToUnixMillis(after.time);
  p.step = after.step;
  const int64_t steps = after.step - before.step;
  p.steps_per_second = static_cast<double>(steps) / absl::ToDoubleSeconds(after.time - before.time);
  if (steps > 0) {
    p.bytes_per_step = static_cast<double>(after.comm_bytes - before.comm_bytes) /
                       static_cast<double>(steps) / static_cast<double>(after.active_members);
  }
  return p;
}

void JobHistory::Sample(const server::JobRegistry& registry, absl::Time now) {
  // Read the registry before taking our lock: Describe takes each job's lock in turn.
  std::set<std::string> held;
  std::vector<std::pair<std::string, std::optional<JobSample>>> samples;
  for (const v1::JobSummary& summary : registry.ListJobs()) {
    held.insert(summary.job_id());
    if (summary.state() == v1::JOB_ENDED) continue;  // its last points stay as they were
    auto description = registry.Describe(summary.job_id());
    if (!description.ok()) continue;  // gone since it was listed
    samples.emplace_back(summary.job_id(), SampleOf(*description, now));
  }
  MutexLock lock(&mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    it = held.count(it->first) == 0 ? jobs_.erase(it) : std::next(it);
  }
  for (const auto& [job_id, sample] : samples) {
    if (sample) {
      AddLocked(job_id, *sample);
    } else if (auto it = jobs_.find(job_id); it != jobs_.end()) {
      it->second.last.reset();  // nobody active: the next sample starts afresh
    }
  }
}

void JobHistory::Add(const std::string& job_id, const JobSample& sample) {
  MutexLock lock(&mu_);
  AddLocked(job_id, sample);
}

void JobHistory::AddLocked(const std::string& job_id, const JobSample& sample) {
  Series& series = jobs_[job_id];
  if (series.last) {
    if (std::optional<HistoryPoint> p = PointBetween(*series.last, sample)) {
      series.points.push_back(*p);
      while (series.points.size() > max_samples_) series.points.pop_front();
    }
  }
  series.last = sample;
}

std::vector<HistoryPoint> JobHistory::Of(const std::string& job_id) const {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return {};
  return {it->second.points.begin(), it->second.points.end()};
}

std::optional<HistoryPoint> JobHistory::Last(const std::string& job_id) const {
  MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.points.empty()) return std::nullopt;
  return it->second.points.back();
}

}  // namespace zerod::status
