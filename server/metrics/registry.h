#ifndef ZEROD_SERVER_METRICS_REGISTRY_H_
#define ZEROD_SERVER_METRICS_REGISTRY_H_

// A small metrics registry: counters, gauges and histograms in families with fixed label names,
// written in the Prometheus text format (text_format.h). Ours because Debian has no
// prometheus-cpp; it does only what zerod needs.
//
// A family's series are created on first use (WithLabels) and live until removed.
// Every method is thread-safe; updates take no family-wide lock (counters and gauges are atomics,
// a histogram has its own lock).
//
// What comes from elsewhere at scrape time (a job's members, its memory) is not kept here: the
// owner of that state writes it with a TextWriter after Registry::Scrape.

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "server/metrics/text_format.h"

namespace zerod::metrics {

class Counter {
 public:
  void Increment(double by = 1) { value_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double by) { value_.fetch_add(by, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // `bounds`: the buckets' upper bounds, increasing; +Inf is implied.
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  void Observe(absl::Duration duration) { Observe(absl::ToDoubleSeconds(duration)); }

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // by bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // A consistent view: count equals the +Inf bucket.
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, +Inf last
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// Latency buckets in seconds, 10 µs to 10 s.
std::vector<double> LatencyBuckets();

enum class MetricType { kCounter, kGauge, kHistogram };

class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, MetricType type,
             std::vector<std::string> label_names);
  virtual ~FamilyBase() = default;
  const std::string& name() const { return name_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  // # HELP, # TYPE and every series, in label order.
  virtual void Write(TextWriter& out) const = 0;

 protected:
  Labels LabelsOf(const std::vector<std::string>& values) const;

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
};

template <typename Metric>
class Family : public FamilyBase {
 public:
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::function<std::shared_ptr<Metric>()> make)
      : FamilyBase(std::move(name), std::move(help), type, std::move(label_names)),
        make_(std::move(make)) {}

  // The series with these label values (one per label name), created at zero on first use.
  // Shared: a series removed (RemoveIf) while a caller updates it lives until that caller is done.
  std::shared_ptr<Metric> WithLabels(const std::vector<std::string>& values);
  void Remove(const std::vector<std::string>& values);
  // Removes every series for which `drop(values)` is true.
  void RemoveIf(const std::function<bool(const std::vector<std::string>&)>& drop);
  size_t size() const;

  void Write(TextWriter& out) const override;

 private:
  const std::function<std::shared_ptr<Metric>()> make_;
  mutable Mutex mu_;
  std::map<std::vector<std::string>, std::shared_ptr<Metric>> series_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = Family<Counter>;
using GaugeFamily = Family<Gauge>;
using HistogramFamily = Family<Histogram>;

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // A name used twice, or an invalid metric or label name, is a programming error: it aborts.
  CounterFamily& AddCounter(std::string name, std::string help,
                            std::vector<std::string> label_names = {});
  GaugeFamily& AddGauge(std::string name, std::string help,
                        std::vector<std::string> label_names = {});
  HistogramFamily& AddHistogram(std::string name, std::string help,
                                std::vector<std::string> label_names = {},
                                std::vector<double> bounds = LatencyBuckets());

  // Every family, in name order, in the text format.
  void Write(TextWriter& out) const;
  std::string Scrape() const;

 private:
  FamilyBase& Add(std::unique_ptr<FamilyBase> family);

  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
};

// The process's registry: what zerod's parts count (server_metrics.h) lives here.
Registry& DefaultRegistry();

}  // namespace zerod::metrics

#endif  // ZEROD_SERVER_METRICS_REGISTRY_H_
