#ifndef ZEROD_SERVER_STATUS_HISTORY_SAMPLER_H_
#define ZEROD_SERVER_STATUS_HISTORY_SAMPLER_H_

// HistorySampler: fills a JobHistory from the registry every `period` (job_history.h says why a
// timer and not the page's requests).
//
// Owns one thread, started by the constructor and stopped (joined) by Stop or the destructor;
// stop it before the registry goes.

#include <thread>

#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/job_registry.h"
#include "server/status/job_history.h"

namespace zerod::status {

class HistorySampler {
 public:
  // `registry` must outlive the sampler's thread.
  explicit HistorySampler(const server::JobRegistry* registry,
                          absl::Duration period = absl::Seconds(1),
                          size_t max_samples = JobHistory::kDefaultMaxSamples);
  ~HistorySampler();
  HistorySampler(const HistorySampler&) = delete;
  HistorySampler& operator=(const HistorySampler&) = delete;

  const JobHistory& history() const { return history_; }
  void Stop();  // idempotent

 private:
  void Loop();

  const server::JobRegistry* const registry_;
  const absl::Duration period_;
  JobHistory history_;
  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace zerod::status

#endif  // ZEROD_SERVER_STATUS_HISTORY_SAMPLER_H_
