#ifndef ZEROD_SERVER_METRICS_STEP_RATE_H_
#define ZEROD_SERVER_METRICS_STEP_RATE_H_

// StepRate: a job's steps per second, from the steps seen at successive scrapes.
//
// The rate is taken over a window (30 s by default) ending now, from the oldest sample inside it,
// or from the previous sample when scrapes come further apart than the window: however often
// Prometheus scrapes, the rate is a recent one. A step that goes backwards (a rank restarted from
// a checkpoint) starts the samples over. Not thread-safe: its owner serializes scrapes.

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/time/time.h"

namespace zerod::metrics {

class StepRate {
 public:
  explicit StepRate(absl::Duration window = absl::Seconds(30)) : window_(window) {}

  // Records `step` for `job` at `now` and returns its steps per second; nullopt until two samples
  // at distinct times exist.
  std::optional<double> Update(const std::string& job, int64_t step, absl::Time now);
  // Forgets every job not in `jobs` (ended or gone).
  void Retain(const std::set<std::string>& jobs);

 private:
  struct Sample {
    absl::Time time;
    int64_t step;
  };
  static constexpr size_t kMaxSamples = 256;
  const absl::Duration window_;
  std::map<std::string, std::deque<Sample>> samples_;
};

}  // namespace zerod::metrics

#endif  // ZEROD_SERVER_METRICS_STEP_RATE_H_
