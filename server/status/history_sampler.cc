#include "server/status/history_sampler.h"

#include "absl/time/clock.h"

namespace zerod::status {

HistorySampler::HistorySampler(const server::JobRegistry* registry, absl::Duration period,
                               size_t max_samples)
    : registry_(registry), period_(period), history_(max_samples) {
  thread_ = std::thread([this] { Loop(); });
}

HistorySampler::~HistorySampler() { Stop(); }

void HistorySampler::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void HistorySampler::Loop() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.Unlock();
    history_.Sample(*registry_, absl::Now());
    mu_.Lock();
    mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; },
                         period_);
  }
}

}  // namespace zerod::status
