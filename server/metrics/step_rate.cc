#include "server/metrics/step_rate.h"

namespace zerod::metrics {

std::optional<double> StepRate::Update(const std::string& job, int64_t step, absl::Time now) {
  std::deque<Sample>& samples = samples_[job];
  if (!samples.empty() && (step < samples.back().step || now < samples.back().time)) {
    samples.clear();
  }
  samples.push_back(Sample{now, step});
  // Drop samples older than the window, keeping at least one before the newest.
  while (samples.size() > 2 && samples[1].time <= now - window_) samples.pop_front();
  // A client scraping in a tight loop does not grow the samples without bound.
  if (samples.size() > kMaxSamples) samples.pop_front();
  const Sample& oldest = samples.front();
  if (samples.size() < 2 || oldest.time == now) return std::nullopt;
  return static_cast<double>(step - oldest.step) / absl::ToDoubleSeconds(now - oldest.time);
}

void StepRate::Retain(const std::set<std::string>& jobs) {
  std::erase_if(samples_, [&jobs](const auto& entry) { return !jobs.contains(entry.first); });
}

}  // namespace zerod::metrics
