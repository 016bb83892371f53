#include "server/metrics/registry.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace zerod::metrics {
namespace {

[[noreturn]] void Misuse(const std::string& what) {
  std::fprintf(stderr, "metrics registry: %s\n", what.c_str());
  std::abort();
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void WriteSeries(TextWriter& out, const std::string& name, const Labels& labels,
                 const Counter& counter) {
  out.Sample(name, labels, counter.value());
}

void WriteSeries(TextWriter& out, const std::string& name, const Labels& labels,
                 const Gauge& gauge) {
  out.Sample(name, labels, gauge.value());
}

void WriteSeries(TextWriter& out, const std::string& name, const Labels& labels,
                 const Histogram& histogram) {
  const Histogram::Snapshot snapshot = histogram.Read();
  Labels with_le = labels;
  with_le.emplace_back("le", "");
  for (size_t i = 0; i <= snapshot.bounds.size(); ++i) {
    with_le.back().second =
        i < snapshot.bounds.size() ? FormatValue(snapshot.bounds[i]) : std::string("+Inf");
    out.Sample(name + "_bucket", with_le, static_cast<double>(snapshot.cumulative[i]));
  }
  out.Sample(name + "_sum", labels, snapshot.sum);
  out.Sample(name + "_count", labels, static_cast<double>(snapshot.count));
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  if (!std::is_sorted(bounds_.begin(), bounds_.end()) ||
      std::adjacent_find(bounds_.begin(), bounds_.end()) != bounds_.end()) {
    Misuse("histogram bounds must increase");
  }
}

void Histogram::Observe(double value) {
  // The first bucket whose bound is >= value ("le"); past the last, +Inf.
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.bounds = bounds_;
  MutexLock lock(&mu_);
  uint64_t running = 0;
  for (uint64_t count : counts_) {
    running += count;
    snapshot.cumulative.push_back(running);
  }
  snapshot.count = running;
  snapshot.sum = sum_;
  return snapshot;
}

std::vector<double> LatencyBuckets() {
  // From 10 µs: a heartbeat is handled in microseconds; to 10 s: a Store wait or a slow fsync.
  return {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
          0.025,   0.05,     0.1,     0.25,   0.5,     1,      2.5,   5,      10};
}

FamilyBase::FamilyBase(std::string name, std::string help, MetricType type,
                       std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {
  if (!IsValidMetricName(name_)) Misuse(absl::StrCat("invalid metric name '", name_, "'"));
  for (const std::string& label : label_names_) {
    if (!IsValidLabelName(label) || (type_ == MetricType::kHistogram && label == "le")) {
      Misuse(absl::StrCat(name_, ": invalid label name '", label, "'"));
    }
  }
}

Labels FamilyBase::LabelsOf(const std::vector<std::string>& values) const {
  Labels labels;
  labels.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) labels.emplace_back(label_names_[i], values[i]);
  return labels;
}

template <typename Metric>
std::shared_ptr<Metric> Family<Metric>::WithLabels(const std::vector<std::string>& values) {
  if (values.size() != label_names_.size()) {
    Misuse(absl::StrCat(name_, ": ", values.size(), " label values for ", label_names_.size(),
                        " labels"));
  }
  MutexLock lock(&mu_);
  std::shared_ptr<Metric>& slot = series_[values];
  if (slot == nullptr) slot = make_();
  return slot;
}

template <typename Metric>
void Family<Metric>::Remove(const std::vector<std::string>& values) {
  MutexLock lock(&mu_);
  series_.erase(values);
}

template <typename Metric>
void Family<Metric>::RemoveIf(const std::function<bool(const std::vector<std::string>&)>& drop) {
  MutexLock lock(&mu_);
  std::erase_if(series_, [&drop](const auto& entry) { return drop(entry.first); });
}

template <typename Metric>
size_t Family<Metric>::size() const {
  MutexLock lock(&mu_);
  return series_.size();
}

template <typename Metric>
void Family<Metric>::Write(TextWriter& out) const {
  out.Header(name_, help_, TypeName(type_));
  MutexLock lock(&mu_);
  for (const auto& [values, metric] : series_) WriteSeries(out, name_, LabelsOf(values), *metric);
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

CounterFamily& Registry::AddCounter(std::string name, std::string help,
                                    std::vector<std::string> label_names) {
  return static_cast<CounterFamily&>(Add(std::make_unique<CounterFamily>(
      std::move(name), std::move(help), MetricType::kCounter, std::move(label_names),
      [] { return std::make_shared<Counter>(); })));
}

GaugeFamily& Registry::AddGauge(std::string name, std::string help,
                                std::vector<std::string> label_names) {
  return static_cast<GaugeFamily&>(Add(std::make_unique<GaugeFamily>(
      std::move(name), std::move(help), MetricType::kGauge, std::move(label_names),
      [] { return std::make_shared<Gauge>(); })));
}

HistogramFamily& Registry::AddHistogram(std::string name, std::string help,
                                        std::vector<std::string> label_names,
                                        std::vector<double> bounds) {
  Histogram check(bounds);  // bad bounds abort here, not at a first observation
  return static_cast<HistogramFamily&>(Add(std::make_unique<HistogramFamily>(
      std::move(name), std::move(help), MetricType::kHistogram, std::move(label_names),
      [bounds] { return std::make_shared<Histogram>(bounds); })));
}

FamilyBase& Registry::Add(std::unique_ptr<FamilyBase> family) {
  MutexLock lock(&mu_);
  auto [it, inserted] = families_.try_emplace(family->name(), std::move(family));
  if (!inserted) Misuse(absl::StrCat("metric '", it->first, "' registered twice"));
  return *it->second;
}

void Registry::Write(TextWriter& out) const {
  MutexLock lock(&mu_);
  for (const auto& [name, family] : families_) family->Write(out);
}

std::string Registry::Scrape() const {
  TextWriter out;
  Write(out);
  return out.Take();
}

Registry& DefaultRegistry() {
  static Registry* const registry = new Registry();
  return *registry;
}

}  // namespace zerod::metrics
