#ifndef ZEROD_SERVER_METRICS_SERVER_METRICS_H_
#define ZEROD_SERVER_METRICS_SERVER_METRICS_H_

// What zerod's parts count as they work, in the process's registry (DefaultRegistry). The state
// of jobs and ranks (by state, steps, memory, bytes sent) is not counted here: job_metrics.h reads
// it from the JobRegistry at scrape time.
//
// A job's label is `job_id`, not `job`: Prometheus gives every series of a target its own `job`.
//
// Label sets are bounded: `job_id` by the jobs the daemon holds (a job's series go when it ends,
// see job_metrics.h), `method` by the services' methods (unknown ones count as "other"), `code` by
// the 17 status codes, `op` by the Store service's operations.

#include "server/metrics/registry.h"

namespace zerod::metrics {

struct ServerMetrics {
  CounterFamily& joins;                      // {job_id}: joins answered with a rank
  CounterFamily& losses;                     // {job_id}: members whose lease ran out
  CounterFamily& heartbeats;                 // {job_id}
  HistogramFamily& heartbeat_seconds;        // time to handle one heartbeat
  CounterFamily& store_operations;           // {op, code}
  HistogramFamily& store_operation_seconds;  // {op}
  HistogramFamily& sqlite_commit_seconds;    // one transaction, write to fsync
  CounterFamily& grpc_calls;                 // {method, code}
  HistogramFamily& grpc_call_seconds;        // {method}
};

// Registered in DefaultRegistry on first use.
const ServerMetrics& Metrics();

}  // namespace zerod::metrics

#endif  // ZEROD_SERVER_METRICS_SERVER_METRICS_H_
