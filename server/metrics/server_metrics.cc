#include "server/metrics/server_metrics.h"

namespace zerod::metrics {

const ServerMetrics& Metrics() {
  static const ServerMetrics* const metrics = [] {
    Registry& r = DefaultRegistry();
    return new ServerMetrics{
        r.AddCounter("zerod_job_joins_total", "Joins answered with a rank, by job.", {"job_id"}),
        r.AddCounter("zerod_job_losses_total",
                     "Members declared lost (their lease ran out), by job.", {"job_id"}),
        r.AddCounter("zerod_heartbeats_total", "Heartbeats received, by job.", {"job_id"}),
        r.AddHistogram("zerod_heartbeat_duration_seconds",
                       "Time zerod took to handle one heartbeat."),
        r.AddCounter("zerod_store_operations_total",
                     "Store service operations (set, get, wait, add, ...) by outcome.",
                     {"op", "code"}),
        r.AddHistogram("zerod_store_operation_duration_seconds",
                       "Time a Store operation took, from request to answer (a wait's included).",
                       {"op"}),
        r.AddHistogram("zerod_sqlite_commit_duration_seconds",
                       "Time one SQLite state commit took (the transaction and its sync)."),
        r.AddCounter("zerod_grpc_calls_total", "gRPC calls handled, by method and status code.",
                     {"method", "code"}),
        r.AddHistogram("zerod_grpc_call_duration_seconds",
                       "Time a gRPC call took, from its start to its status.", {"method"}),
    };
  }();
  return *metrics;
}

}  // namespace zerod::metrics
