#ifndef ZEROD_SERVER_STATUS_JOB_HISTORY_H_
#define ZEROD_SERVER_STATUS_JOB_HISTORY_H_

// JobHistory: the status page's short memory of each job's progress, step rate and bytes sent per
// step, so that a page opened now can draw the last few minutes. Nothing of it is stored: a
// restarted daemon starts with an empty history.
//
// Sampled by a timer (HistorySampler, history_sampler.h), not by the page's requests: the history
// is there when an operator opens the page because a job slowed down, and its spacing does not
// depend on how many pages are open. Bounded: at most `max_samples` points per job, and only for
// jobs the registry still holds (an ended job keeps its last points until the registry forgets
// it).
//
// Thread-safe.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/job_registry.h"

namespace zerod::status {

// One point of a job's history, between two samples of the same generation.
struct HistoryPoint {
  int64_t unix_ms = 0;
  int64_t step = 0;  // the slowest active member's step
  double steps_per_second = 0;
  // Bytes one rank sent per step (all collectives, averaged over the active members); nullopt when
  // no step was taken since the sample before.
  std::optional<double> bytes_per_step;
};

// What the sampler reads of one job at one time.
struct JobSample {
  absl::Time time;
  int64_t generation = 0;
  int64_t active_members = 0;
  int64_t step = 0;        // min over the active members
  int64_t comm_bytes = 0;  // sum over the active members and their collectives
};

// The sample of a job as described now, or nullopt when it has no active member (nothing moves).
std::optional<JobSample> SampleOf(const v1::JobDescription& job, absl::Time now);

// The point between two samples, or nullopt when they cannot be compared: another generation or
// set of members (a rank restarted: its counters start again), a counter that went back, or no
// time between them.
std::optional<HistoryPoint> PointBetween(const JobSample& before, const JobSample& after);

class JobHistory {
 public:
  static constexpr size_t kDefaultMaxSamples = 300;  // 5 minutes at the sampler's 1 s

  explicit JobHistory(size_t max_samples = kDefaultMaxSamples) : max_samples_(max_samples) {}
  JobHistory(const JobHistory&) = delete;
  JobHistory& operator=(const JobHistory&) = delete;

  // Reads every job the registry holds at `now` and adds a point to those that moved; forgets the
  // jobs the registry no longer holds.
  void Sample(const server::JobRegistry& registry, absl::Time now);
  // Adds `sample` of `job_id` (Sample's step for one job; for tests).
  void Add(const std::string& job_id, const JobSample& sample);

  // The job's points, oldest first (empty for a job never sampled).
  std::vector<HistoryPoint> Of(const std::string& job_id) const;
  // The job's newest point, if any.
  std::optional<HistoryPoint> Last(const std::string& job_id) const;

  size_t max_samples() const { return max_samples_; }

 private:
  struct Series {
    std::optional<JobSample> last;  // the sample the next point is measured from
    std::deque<HistoryPoint> points;
  };

  void AddLocked(const std::string& job_id, const JobSample& sample)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_samples_;
  mutable Mutex mu_;
  std::map<std::string, Series> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zerod::status

#endif  // ZEROD_SERVER_STATUS_JOB_HISTORY_H_
