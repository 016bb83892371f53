#include "client/coordinator_client.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/credentials.h"
#include "client/environment.h"
#include "proto/auth_metadata.h"
#include "proto/grpc_status.h"
#include "proto/plan_convert.h"
#include "runtime/common/status_macros.h"
#include "runtime/plan/digest.h"

namespace zerod::client {
namespace {

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", what, " ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// TLS when a CA is given and the endpoint is TCP; the Unix socket is local and stays plain.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const std::string& endpoint, const ClientOptions& options) {
  const std::string ca = options.tls_ca_file.empty() ? Env("ZEROD_TLS_CA") : options.tls_ca_file;
  if (absl::StartsWith(endpoint, "unix:") || ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ZEROD_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(ca, "the TLS CA (ZEROD_TLS_CA)"));
  const std::string cert =
      options.tls_cert_file.empty() ? Env("ZEROD_TLS_CERT") : options.tls_cert_file;
  const std::string key =
      options.tls_key_file.empty() ? Env("ZEROD_TLS_KEY") : options.tls_key_file;
  if (!cert.empty() || !key.empty()) {
    ZEROD_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                           ReadPem(cert, "the client certificate (ZEROD_TLS_CERT)"));
    ZEROD_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(key, "the client key (ZEROD_TLS_KEY)"));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::string> ResolveEndpoint(const std::string& flag) {
  std::string endpoint = flag;
  if (endpoint.empty()) {
    const char* env = std::getenv("ZEROD_ENDPOINT");
    if (env != nullptr) endpoint = env;
  }
  if (endpoint.empty()) {
    return absl::InvalidArgumentError(
        "no zerod endpoint: pass --endpoint (unix:///run/zerod/zerod.sock or host:port) or set "
        "ZEROD_ENDPOINT");
  }
  return endpoint;
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Connect(
    ClientOptions options) {
  auto endpoint = ResolveEndpoint(options.endpoint);
  if (!endpoint.ok()) return endpoint.status();
  auto credentials = ChannelCredentialsFor(*endpoint, options);
  if (!credentials.ok()) return credentials.status();
  const bool tls =
      !absl::StartsWith(*endpoint, "unix:") &&
      !(options.tls_ca_file.empty() ? Env("ZEROD_TLS_CA") : options.tls_ca_file).empty();
  auto client = std::unique_ptr<CoordinatorClient>(
      new CoordinatorClient(options, *endpoint, *std::move(credentials)));
  client->tls_ = tls;
  return client;
}

CoordinatorClient::CoordinatorClient(ClientOptions options, std::string endpoint,
                                     std::shared_ptr<grpc::ChannelCredentials> credentials)
    : options_(std::move(options)), endpoint_(std::move(endpoint)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(options_.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(options_.max_message_bytes));
  // Reconnect quickly after a daemon restart.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(endpoint_, credentials, args);
  coordinator_ = v1::Coordinator::NewStub(channel_);
  store_ = v1::Store::NewStub(channel_);
  inspect_ = v1::Inspect::NewStub(channel_);
}

CoordinatorClient::~CoordinatorClient() { StopHeartbeats(); }

std::string CoordinatorClient::TokenOf(const std::string& job_id) {
  if (!options_.job_token.empty()) return options_.job_token;
  {
    MutexLock lock(&tokens_mu_);
    if (auto it = tokens_.find(job_id); it != tokens_.end()) return it->second;
  }
  std::string token = JobTokenFor(job_id);
  if (!token.empty()) {
    MutexLock lock(&tokens_mu_);
    tokens_[job_id] = token;
  }
  return token;
}

void CoordinatorClient::Authenticate(grpc::ClientContext& context, const std::string& job_id) {
  if (const std::string token = job_id.empty() ? "" : TokenOf(job_id); !token.empty()) {
    context.AddMetadata(rpc::kJobTokenMetadata, token);
  }
  if (!options_.admin_token.empty()) {
    context.AddMetadata(rpc::kAdminTokenMetadata, options_.admin_token);
  }
  if (!options_.viewer_token.empty()) {
    context.AddMetadata(rpc::kViewerTokenMetadata, options_.viewer_token);
  }
}

template <typename Stub, typename Request, typename Response>
absl::StatusOr<Response> CoordinatorClient::Unary(
    const char* what, absl::Duration timeout, Stub& stub,
    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*),
    const Request& request, absl::Time not_before, absl::Duration max_backoff) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  // Never a busy loop, never longer than any call's.
  max_backoff = std::clamp(max_backoff, absl::Milliseconds(10), kMaxRetryBackoff);
  absl::Duration backoff = std::min(absl::Milliseconds(50), max_backoff);
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(std::max(absl::Now() + timeout, not_before)));
    if constexpr (requires { request.job_id(); }) {
      Authenticate(context, request.job_id());
    } else {
      Authenticate(context, "");  // ListJobs: the admin or viewer token, over TCP
    }
    Response response;
    const grpc::Status status = (stub.*method)(&context, request, &response);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) {
      NoteAnswered();
      if (status.ok()) return response;
      return rpc::FromGrpc(status);
    }
    // Every call shares the outage's one budget: once the daemon has been away for retry_for,
    // each call fails after one attempt instead of retrying for retry_for of its own (a trainer
    // whose daemon was gone for good spent minutes in heartbeat, heartbeat and leave in turn).
    const absl::Time give_up = NoteUnavailable() + options_.retry_for;
    if (absl::Now() >= give_up) {
      return absl::UnavailableError(absl::StrCat(
          what, ": zerod at ", endpoint_, " unavailable for ",
          absl::FormatDuration(options_.retry_for), ": ", status.error_message(), TlsHint()));
    }
    // Full jitter: sleep uniformly in [backoff/2, backoff], doubling up to max_backoff.
    std::uniform_int_distribution<int64_t> jitter(absl::ToInt64Microseconds(backoff) / 2,
                                                  absl::ToInt64Microseconds(backoff));
    absl::SleepFor(std::min(absl::Microseconds(jitter(rng)), give_up - absl::Now()));
    backoff = std::min(backoff * 2, max_backoff);
  }
}

std::string CoordinatorClient::TlsHint() const {
  if (absl::StartsWith(endpoint_, "unix:")) return "";
  return tls_ ? " (if the TLS handshake failed: ZEROD_TLS_CA must be the CA that signed zerod's "
                "certificate, and a zerod started with --tls-client-ca also needs ZEROD_TLS_CERT "
                "and ZEROD_TLS_KEY)"
              : " (a zerod whose TCP listener uses TLS closes a plaintext client's connection: "
                "set ZEROD_TLS_CA to the CA that signed its certificate)";
}

absl::Time CoordinatorClient::NoteUnavailable() {
  MutexLock lock(&outage_mu_);
  if (unavailable_since_ == absl::InfiniteFuture()) unavailable_since_ = absl::Now();
  return unavailable_since_;
}

void CoordinatorClient::NoteAnswered() {
  MutexLock lock(&outage_mu_);
  unavailable_since_ = absl::InfiniteFuture();
}

absl::StatusOr<Membership> CoordinatorClient::Join(const JoinOptions& o, absl::Duration wait) {
  v1::JoinRequest request;
  request.set_job_id(o.job_id);
  request.set_world_size(o.world_size);
  request.set_rank(o.rank);
  request.set_host(o.host.empty() ? Hostname() : o.host);
  request.set_device(o.device);
  request.set_budget_bytes(o.budget_bytes);
  if (o.send_layout) rpc::ToProto(o.layout, request.mutable_layout());
  request.set_layout_digest(plan::DigestHex(plan::LayoutDigest(o.layout)));
  *request.mutable_options() = rpc::ToProto(o.plan_options);
  request.mutable_options()->mutable_agreed()->insert(o.agreed_options.begin(),
                                                      o.agreed_options.end());
  // The join that creates a job says who owns it: without a token at hand, this user gets one.
  if (options_.job_token.empty() && TokenOf(o.job_id).empty() && !o.job_id.empty()) {
    if (absl::StatusOr<std::string> made = JobTokenOrNew(o.job_id); made.ok()) {
      MutexLock lock(&tokens_mu_);
      tokens_[o.job_id] = *made;
    }
    // Else the join goes without one and zerod's refusal says what is missing.
  }
  // A retried join waits only what is left of `wait` (but at least a second, to be answered).
  ZEROD_ASSIGN_OR_RETURN(const v1::JoinResponse response,
                         Unary("join", absl::Seconds(1), *coordinator_,
                               &v1::Coordinator::Stub::Join, request, absl::Now() + wait));
  Membership m;
  if (!m.plan_inputs.ParseFromString(response.plan_inputs())) {
    return absl::DataLossError(
        absl::StrCat("join ", o.job_id, ": the plan from zerod does not parse"));
  }
  auto plan = rpc::PlanFromInputs(m.plan_inputs);
  if (!plan.ok()) return plan.status();
  m.rank = response.rank();
  m.generation = response.generation();
  m.world_size = response.world_size();
  m.lease_ttl = absl::Milliseconds(response.lease_ttl_ms());
  m.node_address = response.node_address();
  m.plan = std::make_shared<const plan::ShardPlan>(*std::move(plan));
  return m;
}

absl::StatusOr<v1::PlanInputs> CoordinatorClient::GetPlan(const std::string& job_id) {
  v1::GetPlanRequest request;
  request.set_job_id(job_id);
  return Unary("get plan", options_.call_timeout, *coordinator_, &v1::Coordinator::Stub::GetPlan,
               request);
}

absl::StatusOr<v1::HeartbeatResponse> CoordinatorClient::Heartbeat(const std::string& job_id,
                                                                   int64_t rank, int64_t generation,
                                                                   const HeartbeatReport& report,
                                                                   absl::Duration max_backoff) {
  v1::HeartbeatRequest request;
  request.set_job_id(job_id);
  request.set_rank(rank);
  request.set_generation(generation);
  request.set_step(report.step);
  request.mutable_memory_bytes()->insert(report.memory_bytes.begin(), report.memory_bytes.end());
  request.mutable_comm_bytes()->insert(report.comm_bytes.begin(), report.comm_bytes.end());
  return Unary("heartbeat", options_.call_timeout, *coordinator_, &v1::Coordinator::Stub::Heartbeat,
               request, absl::InfinitePast(), max_backoff);
}

absl::StatusOr<int64_t> CoordinatorClient::Leave(const std::string& job_id, int64_t rank) {
  v1::LeaveRequest request;
  request.set_job_id(job_id);
  request.set_rank(rank);
  ZEROD_ASSIGN_OR_RETURN(
      const v1::LeaveResponse response,
      Unary("leave", options_.call_timeout, *coordinator_, &v1::Coordinator::Stub::Leave, request));
  return response.generation();
}

absl::Status CoordinatorClient::EndJob(const std::string& job_id) {
  v1::EndJobRequest request;
  request.set_job_id(job_id);
  return Unary("end job", options_.call_timeout, *coordinator_, &v1::Coordinator::Stub::EndJob,
               request)
      .status();
}

absl::StatusOr<v1::CheckpointRecord> CoordinatorClient::RecordCheckpoint(
    const v1::CheckpointRecord& record) {
  v1::RecordCheckpointRequest request;
  request.set_job_id(record.job_id());
  *request.mutable_record() = record;
  ZEROD_ASSIGN_OR_RETURN(v1::RecordCheckpointResponse response,
                         Unary("record checkpoint", options_.call_timeout, *coordinator_,
                               &v1::Coordinator::Stub::RecordCheckpoint, request));
  return std::move(*response.mutable_record());
}

void CoordinatorClient::StartHeartbeats(
    const std::string& job_id, int64_t rank, int64_t generation, absl::Duration interval,
    std::function<HeartbeatReport()> report,
    std::function<void(const absl::StatusOr<v1::HeartbeatResponse>&)> on_reply) {
  StopHeartbeats();
  {
    MutexLock lock(&heartbeat_mu_);
    heartbeat_stop_ = false;
  }
  heartbeat_thread_ = std::thread([this, job_id, rank, generation, interval,
                                   report = std::move(report), on_reply = std::move(on_reply)] {
    auto stopped = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(heartbeat_mu_) { return heartbeat_stop_; };
    MutexLock lock(&heartbeat_mu_);
    while (!heartbeat_stop_) {
      heartbeat_mu_.Unlock();
      auto reply =
          Heartbeat(job_id, rank, generation, report ? report() : HeartbeatReport{}, interval);
      if (on_reply) on_reply(reply);
      heartbeat_mu_.Lock();
      heartbeat_mu_.AwaitWithTimeout(stopped, interval);
    }
  });
}

void CoordinatorClient::StopHeartbeats() {
  {
    MutexLock lock(&heartbeat_mu_);
    heartbeat_stop_ = true;
  }
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

absl::Status CoordinatorClient::Watch(const std::string& job_id,
                                      const std::function<bool(const v1::JobEvent&)>& on_event) {
  v1::WatchRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;
  Authenticate(context, job_id);
  auto reader = coordinator_->Watch(&context, request);
  v1::JobEvent event;
  while (reader->Read(&event)) {
    if (!on_event(event)) {
      context.TryCancel();
      reader->Finish().ok();
      return absl::OkStatus();
    }
  }
  return rpc::FromGrpc(reader->Finish());
}

absl::Status CoordinatorClient::StoreSet(const std::string& job_id, const std::string& key,
                                         const std::string& value) {
  v1::SetRequest request;
  request.set_job_id(job_id);
  request.set_key(key);
  request.set_value(value);
  return Unary("store set", options_.call_timeout, *store_, &v1::Store::Stub::Set, request)
      .status();
}

absl::StatusOr<std::string> CoordinatorClient::StoreGet(const std::string& job_id,
                                                        const std::string& key,
                                                        absl::Duration timeout) {
  v1::GetRequest request;
  request.set_job_id(job_id);
  request.set_key(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  ZEROD_ASSIGN_OR_RETURN(
      v1::GetResponse response,
      Unary("store get", timeout + options_.call_timeout, *store_, &v1::Store::Stub::Get, request));
  return std::move(*response.mutable_value());
}

absl::StatusOr<int64_t> CoordinatorClient::StoreAdd(const std::string& job_id,
                                                    const std::string& key, int64_t delta) {
  v1::AddRequest request;
  request.set_job_id(job_id);
  request.set_key(key);
  request.set_delta(delta);
  ZEROD_ASSIGN_OR_RETURN(
      const v1::AddResponse response,
      Unary("store add", options_.call_timeout, *store_, &v1::Store::Stub::Add, request));
  return response.value();
}

absl::StatusOr<v1::CompareSetResponse> CoordinatorClient::StoreCompareSet(
    const std::string& job_id, const std::string& key, const std::optional<std::string>& expected,
    const std::string& desired) {
  v1::CompareSetRequest request;
  request.set_job_id(job_id);
  request.set_key(key);
  request.set_expected_absent(!expected.has_value());
  if (expected) request.set_expected(*expected);
  request.set_desired(desired);
  return Unary("store compare-set", options_.call_timeout, *store_, &v1::Store::Stub::CompareSet,
               request);
}

absl::StatusOr<bool> CoordinatorClient::StoreDelete(const std::string& job_id,
                                                    const std::string& key) {
  v1::DeleteRequest request;
  request.set_job_id(job_id);
  request.set_key(key);
  ZEROD_ASSIGN_OR_RETURN(
      const v1::DeleteResponse response,
      Unary("store delete", options_.call_timeout, *store_, &v1::Store::Stub::Delete, request));
  return response.deleted();
}

absl::Status CoordinatorClient::StoreWait(const std::string& job_id,
                                          const std::vector<std::string>& keys,
                                          absl::Duration timeout) {
  v1::WaitRequest request;
  request.set_job_id(job_id);
  for (const std::string& k : keys) request.add_keys(k);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  return Unary("store wait", timeout + options_.call_timeout, *store_, &v1::Store::Stub::Wait,
               request)
      .status();
}

absl::Status CoordinatorClient::Barrier(const std::string& job_id, const std::string& name,
                                        int64_t participant, int64_t count,
                                        absl::Duration timeout) {
  v1::BarrierRequest request;
  request.set_job_id(job_id);
  request.set_name(name);
  request.set_participant(participant);
  request.set_count(count);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  return Unary("barrier", timeout + options_.call_timeout, *store_, &v1::Store::Stub::Barrier,
               request)
      .status();
}

absl::StatusOr<v1::ListJobsResponse> CoordinatorClient::ListJobs() {
  return Unary("list jobs", options_.call_timeout, *inspect_, &v1::Inspect::Stub::ListJobs,
               v1::ListJobsRequest());
}

absl::StatusOr<v1::JobDescription> CoordinatorClient::DescribeJob(const std::string& job_id) {
  v1::DescribeJobRequest request;
  request.set_job_id(job_id);
  return Unary("describe job", options_.call_timeout, *inspect_, &v1::Inspect::Stub::DescribeJob,
               request);
}

absl::StatusOr<v1::ShardMapResponse> CoordinatorClient::ShardMap(const std::string& job_id,
                                                                 int64_t rank,
                                                                 const std::string& tensor) {
  v1::ShardMapRequest request;
  request.set_job_id(job_id);
  request.set_rank(rank);
  request.set_tensor(tensor);
  return Unary("shard map", options_.call_timeout, *inspect_, &v1::Inspect::Stub::ShardMap,
               request);
}

absl::StatusOr<std::vector<v1::CheckpointRecord>> CoordinatorClient::ListCheckpoints(
    const std::string& job_id) {
  v1::ListCheckpointsRequest request;
  request.set_job_id(job_id);
  ZEROD_ASSIGN_OR_RETURN(v1::ListCheckpointsResponse response,
                         Unary("list checkpoints", options_.call_timeout, *inspect_,
                               &v1::Inspect::Stub::ListCheckpoints, request));
  return std::vector<v1::CheckpointRecord>(
      std::make_move_iterator(response.mutable_checkpoints()->begin()),
      std::make_move_iterator(response.mutable_checkpoints()->end()));
}

}  // namespace zerod::client
