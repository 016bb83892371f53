#ifndef ZEROD_CLIENT_COORDINATOR_CLIENT_H_
#define ZEROD_CLIENT_COORDINATOR_CLIENT_H_

// CoordinatorClient: the C++ SDK for trainer processes and tools talking to zerod.
//
// Every call has a deadline. Calls that fail with UNAVAILABLE (daemon restarting, socket not yet
// there) are retried with exponential backoff and jitter until ClientOptions::retry_for has
// passed since the daemon was first found unavailable, so clients ride through a daemon restart;
// the budget is per outage, not per call: once it is spent every call fails after one attempt,
// until one is answered again. Thread-safe. StartHeartbeats owns one thread, stopped
// by StopHeartbeats or the destructor.
//
// Credentials (client/credentials.h) go with every call about a job: the job's token (explicit,
// else $ZEROD_JOB_TOKEN, else the user's saved one; a join that would create a job without one
// makes and saves it) and, when given, the admin token. A "host:port" endpoint uses TLS when a CA
// is given ($ZEROD_TLS_CA).

#include <grpcpp/security/credentials.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/common/mutex.h"
#include "runtime/plan/shard_plan.h"
#include "zerod/v1/coordinator.grpc.pb.h"
#include "zerod/v1/inspect.grpc.pb.h"
#include "zerod/v1/store.grpc.pb.h"

namespace zerod::client {

struct ClientOptions {
  // "unix:///run/zerod/zerod.sock", "unix:/path", or "host:port". Empty: $ZEROD_ENDPOINT.
  std::string endpoint;
  absl::Duration call_timeout = absl::Seconds(10);
  // How long calls retry while the daemon is unavailable, counted from the start of the outage.
  absl::Duration retry_for = absl::Seconds(60);
  int64_t max_message_bytes = 64 << 20;
  // Empty: found per job (client/credentials.h JobTokenFor).
  std::string job_token;
  std::string admin_token;  // empty: none
  // The daemon's viewer token: read-only views over TCP (docs/ARCHITECTURE.md). Empty: none.
  std::string viewer_token;
  // TLS for a host:port endpoint; empty: $ZEROD_TLS_CA, $ZEROD_TLS_CERT, $ZEROD_TLS_KEY. No CA:
  // plaintext.
  std::string tls_ca_file;
  std::string tls_cert_file;
  std::string tls_key_file;
};

// Resolves the endpoint (flag, then $ZEROD_ENDPOINT); INVALID_ARGUMENT when neither is set.
absl::StatusOr<std::string> ResolveEndpoint(const std::string& flag);

struct JoinOptions {
  std::string job_id;
  int64_t world_size = 1;
  int64_t rank = -1;  // -1: any
  std::string host;   // default: this machine's hostname
  std::string device = "cpu";
  int64_t budget_bytes = 0;
  std::vector<plan::TensorSpec> layout;
  plan::PlanOptions plan_options;  // stage, dtypes, sizes; world size and budget are ignored
  // Settings outside the plan every rank must give alike (v1::PlanOptions.agreed).
  std::map<std::string, std::string> agreed_options;
  bool send_layout = true;  // false: send only the digest (another rank sends the layout)
};

struct Membership {
  int64_t rank = 0;
  int64_t generation = 0;
  int64_t world_size = 0;
  absl::Duration lease_ttl;
  // Where other nodes reach this rank's node, as its zerod knows it (empty: not known).
  std::string node_address;
  v1::PlanInputs plan_inputs;
  // Recomputed here from plan_inputs; its digest was checked against the daemon's.
  std::shared_ptr<const plan::ShardPlan> plan;
};

// What a rank reports with each heartbeat.
struct HeartbeatReport {
  int64_t step = 0;
  std::map<std::string, int64_t> memory_bytes;
  std::map<std::string, int64_t> comm_bytes;
};

class CoordinatorClient {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorClient>> Connect(ClientOptions options);
  ~CoordinatorClient();
  // The longest wait between two tries of a call that found the daemon unavailable.
  static constexpr absl::Duration kMaxRetryBackoff = absl::Seconds(2);

  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  const std::string& endpoint() const { return endpoint_; }

  // Joins and waits up to `wait` for the job to form; verifies the plan digest locally.
  absl::StatusOr<Membership> Join(const JoinOptions& options, absl::Duration wait);
  absl::StatusOr<v1::PlanInputs> GetPlan(const std::string& job_id);
  // Retried on UNAVAILABLE as every call is, but never waiting more than `max_backoff` (nor
  // kMaxRetryBackoff) between tries: StartHeartbeats passes its interval, so a rank is heard within
  // one interval of its daemon's return rather than after a backoff that may outlast its lease.
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const std::string& job_id, int64_t rank,
                                                  int64_t generation, const HeartbeatReport& report,
                                                  absl::Duration max_backoff = kMaxRetryBackoff);
  absl::StatusOr<int64_t> Leave(const std::string& job_id, int64_t rank);
  absl::Status EndJob(const std::string& job_id);
  // Records a state of one of the job's checkpoints (record.job_id() names the job); returns the
  // record as the daemon stored it, times filled in. Retrying is safe: the same state again
  // changes nothing.
  absl::StatusOr<v1::CheckpointRecord> RecordCheckpoint(const v1::CheckpointRecord& record);

  // Heartbeats every `interval` on a thread of its own; `report` fills each one, `on_reply` sees
  // each answer (or the error after retries failed).
  void StartHeartbeats(const std::string& job_id, int64_t rank, int64_t generation,
                       absl::Duration interval, std::function<HeartbeatReport()> report,
                       std::function<void(const absl::StatusOr<v1::HeartbeatResponse>&)> on_reply);
  void StopHeartbeats();

  // Streams a job's events to `on_event` until it returns false, the job ends, or the stream
  // breaks (then the status says why).
  absl::Status Watch(const std::string& job_id,
                     const std::function<bool(const v1::JobEvent&)>& on_event);

  // Store, scoped to `job_id`. Blocking calls wait up to `timeout`.
  absl::Status StoreSet(const std::string& job_id, const std::string& key,
                        const std::string& value);
  absl::StatusOr<std::string> StoreGet(const std::string& job_id, const std::string& key,
                                       absl::Duration timeout);
  absl::StatusOr<int64_t> StoreAdd(const std::string& job_id, const std::string& key,
                                   int64_t delta);
  absl::StatusOr<v1::CompareSetResponse> StoreCompareSet(const std::string& job_id,
                                                         const std::string& key,
                                                         const std::optional<std::string>& expected,
                                                         const std::string& desired);
  absl::StatusOr<bool> StoreDelete(const std::string& job_id, const std::string& key);
  absl::Status StoreWait(const std::string& job_id, const std::vector<std::string>& keys,
                         absl::Duration timeout);
  absl::Status Barrier(const std::string& job_id, const std::string& name, int64_t participant,
                       int64_t count, absl::Duration timeout);

  // Inspection.
  absl::StatusOr<v1::ListJobsResponse> ListJobs();
  absl::StatusOr<v1::JobDescription> DescribeJob(const std::string& job_id);
  absl::StatusOr<v1::ShardMapResponse> ShardMap(const std::string& job_id, int64_t rank,
                                                const std::string& tensor);
  // The job's checkpoint records, ordered by step.
  absl::StatusOr<std::vector<v1::CheckpointRecord>> ListCheckpoints(const std::string& job_id);

 private:
  explicit CoordinatorClient(ClientOptions options, std::string endpoint,
                             std::shared_ptr<grpc::ChannelCredentials> credentials);

  // For an UNAVAILABLE on a TCP endpoint: what to check about TLS (empty on the Unix socket).
  std::string TlsHint() const;
  // Puts the credentials for calls about `job_id` on `context`.
  void Authenticate(grpc::ClientContext& context, const std::string& job_id);
  // The token of `job_id`, cached once found.
  std::string TokenOf(const std::string& job_id);

  // One unary RPC: `method` of `stub` with `request`, each attempt under a fresh context whose
  // deadline is `timeout` from the attempt's start (but not before `not_before`), retried on
  // UNAVAILABLE with backoff (doubling up to `max_backoff`) until options_.retry_for has passed.
  // `what` names the call in errors.
  template <typename Stub, typename Request, typename Response>
  absl::StatusOr<Response> Unary(const char* what, absl::Duration timeout, Stub& stub,
                                 grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&,
                                                              Response*),
                                 const Request& request,
                                 absl::Time not_before = absl::InfinitePast(),
                                 absl::Duration max_backoff = kMaxRetryBackoff);

  // When the daemon was first found unavailable in the current outage (the start of every
  // call's retry budget), and the end of it: an answer.
  absl::Time NoteUnavailable();
  void NoteAnswered();

  const ClientOptions options_;
  const std::string endpoint_;
  bool tls_ = false;  // a TCP endpoint reached over TLS (set by Connect)
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::unique_ptr<v1::Store::Stub> store_;
  std::unique_ptr<v1::Inspect::Stub> inspect_;

  Mutex tokens_mu_;
  std::map<std::string, std::string> tokens_ ABSL_GUARDED_BY(tokens_mu_);

  Mutex outage_mu_;
  absl::Time unavailable_since_ ABSL_GUARDED_BY(outage_mu_) = absl::InfiniteFuture();

  Mutex heartbeat_mu_;
  bool heartbeat_stop_ ABSL_GUARDED_BY(heartbeat_mu_) = false;
  std::thread heartbeat_thread_;
};

}  // namespace zerod::client

#endif  // ZEROD_CLIENT_COORDINATOR_CLIENT_H_
