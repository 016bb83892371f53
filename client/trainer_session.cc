#include "client/trainer_session.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/coordinator_store.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/comm/prefix_store.h"
#if defined(ZEROD_HAVE_CUDA)
#include "absl/strings/match.h"
#include "runtime/engine/cuda/cuda_ops.h"
#endif

namespace zerod::client {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "" : v;
}

absl::Status EnvInt(const char* name, int64_t& target) {
  const std::string text = Env(name);
  if (text.empty()) return absl::OkStatus();
  if (!absl::SimpleAtoi(text, &target)) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", text, "' is not an integer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerSession>> TrainerSession::Start(SessionOptions o) {
  if (o.job_id.empty()) o.job_id = Env("ZEROD_JOB");
  if (o.job_id.empty()) return absl::InvalidArgumentError("no job: pass --job or set ZEROD_JOB");
  if (o.rank == -2) {
    o.rank = -1;
    if (absl::Status s = EnvInt("ZEROD_RANK", o.rank); !s.ok()) return s;
  }
  if (o.world_size == 0) {
    if (absl::Status s = EnvInt("ZEROD_WORLD_SIZE", o.world_size); !s.ok()) return s;
  }
  if (o.world_size < 1) {
    return absl::InvalidArgumentError("no world size: pass it or set ZEROD_WORLD_SIZE");
  }
#if defined(ZEROD_HAVE_CUDA)
  // A rank on a GPU ("cuda" or "cuda:N") offers what the device has free unless told otherwise.
  if (o.budget_bytes == 0 && absl::StartsWith(o.device, "cuda")) {
    int device = 0;
    if (o.device.size() > 5 && !absl::SimpleAtoi(o.device.substr(5), &device)) {
      return absl::InvalidArgumentError(absl::StrCat("device '", o.device, "' is not cuda:N"));
    }
    auto free = engine::FreeDeviceMemory(device);
    if (!free.ok()) return free.status();
    o.budget_bytes = *free;
  }
#endif
  std::unique_ptr<TrainerSession> s(new TrainerSession());
  s->options_ = o;
  ClientOptions client_options;
  client_options.endpoint = o.endpoint;
  auto client = CoordinatorClient::Connect(client_options);
  if (!client.ok()) return client.status();
  s->client_ = std::move(*client);

  JoinOptions join;
  join.job_id = o.job_id;
  join.world_size = o.world_size;
  join.rank = o.rank;
  join.device = o.device;
  join.budget_bytes = o.budget_bytes;
  join.layout = o.layout;
  join.plan_options = o.plan_options;
  auto membership = s->client_->Join(join, o.join_timeout);
  if (!membership.ok()) return membership.status();
  s->membership_ = *std::move(membership);

  // Keys of this generation only: a re-formed job never reads a stale address.
  s->store_ =
      std::make_shared<comm::PrefixStore>(absl::StrCat("gen", s->membership_.generation),
                                          std::make_shared<CoordinatorStore>(s->client_, o.job_id));
  s->client_->StartHeartbeats(
      o.job_id, s->membership_.rank, s->membership_.generation, o.heartbeat_interval,
      [raw = s.get()] {
        absl::MutexLock lock(&raw->mu_);
        return raw->report_;
      },
      [raw = s.get()](const absl::StatusOr<v1::HeartbeatResponse>& reply) {
        raw->OnHeartbeat(reply);
      });
  comm::GlooOptions gloo;
  gloo.timeout = o.collective_timeout;
  if (const std::string host = Env("ZEROD_GLOO_HOST"); !host.empty()) gloo.hostname = host;
  auto communicator =
      comm::GlooCommunicator::Create(std::make_shared<comm::PrefixStore>("gloo", s->store_),
                                     s->membership_.rank, s->membership_.world_size, gloo);
  if (!communicator.ok()) return s->Explain(communicator.status());
  absl::MutexLock lock(&s->mu_);
  s->communicator_ = *std::move(communicator);
  if (!s->lost_.ok()) s->communicator_->Abort(s->lost_);
  return s;
}

TrainerSession::~TrainerSession() {
  client_->StopHeartbeats();
  communicator_.reset();
}

void TrainerSession::Report(HeartbeatReport report) {
  absl::MutexLock lock(&mu_);
  report_ = std::move(report);
}

void TrainerSession::OnHeartbeat(const absl::StatusOr<v1::HeartbeatResponse>& reply) {
  absl::Status lost;
  if (!reply.ok()) {
    // This rank itself was declared lost (FAILED_PRECONDITION): nothing it computes counts now.
    if (reply.status().code() != absl::StatusCode::kFailedPrecondition) return;
    lost = absl::AbortedError(reply.status().message());
  } else if (reply->lost_ranks_size() > 0) {
    lost = absl::AbortedError(absl::StrCat(
        "job ", options_.job_id, ": rank ", absl::StrJoin(reply->lost_ranks(), ", "),
        reply->lost_ranks_size() == 1 ? " was" : " were", " lost (no heartbeat for ",
        absl::FormatDuration(membership_.lease_ttl), "); generation is now ", reply->generation()));
  } else {
    return;
  }
  absl::MutexLock lock(&mu_);
  if (!lost_.ok()) return;
  lost_ = lost;
  if (communicator_) communicator_->Abort(lost);
}

absl::Status TrainerSession::Explain(const absl::Status& failure) {
  const absl::Time deadline = absl::Now() + 2 * membership_.lease_ttl + absl::Seconds(1);
  absl::MutexLock lock(&mu_);
  auto known = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !lost_.ok(); };
  if (mu_.AwaitWithDeadline(absl::Condition(&known), deadline)) {
    return absl::Status(lost_.code(), absl::StrCat(lost_.message(), " [", failure.message(), "]"));
  }
  return failure;
}

absl::Status TrainerSession::Leave() {
  if (left_) return absl::OkStatus();
  left_ = true;
  client_->StopHeartbeats();
  // A last heartbeat, so what the job shows afterwards is the run's final state.
  HeartbeatReport last;
  {
    absl::MutexLock lock(&mu_);
    last = report_;
  }
  (void)client_->Heartbeat(options_.job_id, membership_.rank, membership_.generation, last);
  auto generation = client_->Leave(options_.job_id, membership_.rank);
  return generation.status();
}

}  // namespace zerod::client
