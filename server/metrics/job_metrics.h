#ifndef ZEROD_SERVER_METRICS_JOB_METRICS_H_
#define ZEROD_SERVER_METRICS_JOB_METRICS_H_

// JobMetrics: the jobs' state as Prometheus series, read from the JobRegistry at each scrape
// (jobs and ranks by state, generation, steps and step rate, memory against the plan, bytes sent
// by collective). Nothing is counted on the heartbeat path for these: a scrape costs one
// Describe per open job.
//
// Bounded labels: job-level series for every open job (forming, running, degraded); per-rank
// series only for jobs of at most `max_ranks_per_job` ranks. A larger job gets its job-level
// aggregates only (the slowest and fastest rank's step, the largest memory by category, the sum of
// bytes sent), so one 4096-rank job cannot add a hundred thousand series. When a job ends, its
// series go, its counters in the default registry (joins, losses, heartbeats) included.

#include <string>

#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/job_registry.h"
#include "server/metrics/step_rate.h"
#include "server/metrics/text_format.h"

namespace zerod::metrics {

struct JobMetricsOptions {
  int64_t max_ranks_per_job = 64;  // --metrics-max-ranks-per-job
};

class JobMetrics {
 public:
  // `registry` must outlive this.
  JobMetrics(const server::JobRegistry* registry, JobMetricsOptions options)
      : registry_(registry), options_(options) {}

  // Writes the jobs' families. Thread-safe (scrapes are serialized).
  void Write(TextWriter& out, absl::Time now);

 private:
  const server::JobRegistry* const registry_;
  const JobMetricsOptions options_;
  Mutex mu_;
  StepRate step_rate_ ABSL_GUARDED_BY(mu_);
};

// The whole /metrics body: the default registry, then `jobs` (when given).
std::string ScrapeAll(JobMetrics* jobs, absl::Time now);

}  // namespace zerod::metrics

#endif  // ZEROD_SERVER_METRICS_JOB_METRICS_H_
