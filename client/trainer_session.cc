#include "client/trainer_session.h"

#include <cstdlib>
#include <functional>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/coordinator_store.h"
#include "client/environment.h"
#include "runtime/comm/abortable_store.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/comm/prefix_store.h"
#include "runtime/common/status_macros.h"
#if defined(ZEROD_HAVE_CUDA)
#include "runtime/comm/nccl/nccl_communicator.h"
#include "runtime/engine/cuda/cuda_ops.h"
#endif

namespace zerod::client {
namespace {

absl::Status EnvInt(const char* name, int64_t& target) {
  const std::string text = Env(name);
  if (text.empty()) return absl::OkStatus();
  if (!absl::SimpleAtoi(text, &target)) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", text, "' is not an integer"));
  }
  return absl::OkStatus();
}

// A switch in the environment: unset (or empty), 0 or 1.
absl::StatusOr<std::optional<bool>> EnvSwitch(const char* name) {
  const std::string text = Env(name);
  if (text.empty()) return std::nullopt;
  if (text != "0" && text != "1") {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", text, "' is not 0 (off) or 1 (on)"));
  }
  return text == "1";
}

}  // namespace

absl::StatusOr<int> ParseDevice(const std::string& device) {
  if (device == "cpu") return -1;
  int n = 0;
  if (device == "cuda") {
    const std::string local = Env("ZEROD_LOCAL_RANK");
    if (local.empty()) return 0;
    if (!absl::SimpleAtoi(local, &n) || n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("plain cuda is GPU $ZEROD_LOCAL_RANK, which is '", local, "'"));
    }
    return n;
  }
  if (absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &n) && n >= 0) {
    return n;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected cpu, cuda or cuda:N, got '", device, "'"));
}

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
  const absl::StatusOr<int> parsed = ParseDevice(o.device);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("device: ", parsed.status().message()));
  }
  const int device = *parsed;
  if (device >= 0) o.device = absl::StrCat("cuda:", device);  // what the coordinator shows
#if defined(ZEROD_HAVE_CUDA)
  if (device >= 0) {
    // Before any NCCL communicator exists: the main and gather communicators share the GPU.
    comm::NcclCommunicator::OrderLaunchesAcrossCommunicators();
    // A rank on a GPU offers what the device has free unless told otherwise.
    if (o.budget_bytes == 0) {
      auto free = engine::FreeDeviceMemory(device);
      if (!free.ok()) {
        return absl::Status(
            free.status().code(),
            absl::StrCat("device '", o.device, "' is not usable: ", free.status().message()));
      }
      o.budget_bytes = *free;
    }
  }
#else
  if (device >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device '", o.device, "': this build has no CUDA (nvcc was not found when it was built)"));
  }
#endif
  ClientOptions defaults;
  absl::Duration retry_for = defaults.retry_for;
  ZEROD_ASSIGN_OR_RETURN(const std::optional<bool> shm, EnvSwitch("ZEROD_GLOO_SHARED_MEMORY"));
  if (shm.has_value()) o.shared_memory = *shm;
  ZEROD_ASSIGN_OR_RETURN(const std::optional<bool> exchange,
                         EnvSwitch("ZEROD_GLOO_SHARD_EXCHANGE"));
  if (exchange.has_value()) o.shard_exchange = *exchange;
  ZEROD_ASSIGN_OR_RETURN(const std::optional<bool> background,
                         EnvSwitch("ZEROD_GLOO_BACKGROUND_START"));
  if (background.has_value()) o.background_start = background;
  if (const std::string retry = Env("ZEROD_RETRY_FOR"); !retry.empty()) {
    if (!absl::ParseDuration(retry, &retry_for) || retry_for < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ZEROD_RETRY_FOR='", retry, "' is not a duration like 30s or 2m"));
    }
  }
  std::unique_ptr<TrainerSession> s(new TrainerSession());
  s->options_ = o;
  s->device_ = device;
  ClientOptions client_options;
  client_options.endpoint = o.endpoint;
  client_options.job_token = o.job_token;
  client_options.retry_for = retry_for;
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
  join.agreed_options = o.agreed_options;
  auto membership = s->client_->Join(join, o.join_timeout);
  if (!membership.ok()) return membership.status();
  s->membership_ = *std::move(membership);

  // Keys of this generation only: a re-formed job never reads a stale address. Abortable: a
  // rendezvous or an order check must not outwait a loss the coordinator reported.
  s->store_ = std::make_shared<comm::AbortableStore>(std::make_shared<comm::PrefixStore>(
      absl::StrCat("gen", s->membership_.generation),
      std::make_shared<CoordinatorStore>(s->client_, o.job_id)));
  s->recorder_ = std::make_unique<CheckpointRecorder>(s->client_, o.job_id);
  s->client_->StartHeartbeats(
      o.job_id, s->membership_.rank, s->membership_.generation, o.heartbeat_interval,
      [raw = s.get()] { return raw->CurrentReport(); },
      [raw = s.get()](const absl::StatusOr<v1::HeartbeatResponse>& reply) {
        raw->OnHeartbeat(reply);
      });
  if (absl::Status c = s->Connect(); !c.ok()) return s->Explain(c, /*wait=*/true);
  return s;
}

bool TrainerSession::uses_shared_memory() const {
  const auto* gloo = dynamic_cast<const comm::GlooCommunicator*>(communicator_.get());
  return gloo != nullptr && gloo->UsesSharedMemory();
}

bool TrainerSession::starts_collectives_in_background() const {
  const auto* gloo = dynamic_cast<const comm::GlooCommunicator*>(communicator_.get());
  return gloo != nullptr && gloo->StartsInBackground();
}

int64_t TrainerSession::shared_memory_pieces() const {
  int64_t pieces = 0;
  for (const auto* c : {communicator_.get(), gather_communicator_.get()}) {
    if (const auto* gloo = dynamic_cast<const comm::GlooCommunicator*>(c)) {
      pieces += gloo->SharedMemoryPieces();
    }
  }
  return pieces;
}

std::string TrainerSession::PeerAddress() const {
  if (std::string host = Env("ZEROD_GLOO_HOST"); !host.empty()) return host;
  if (!options_.peer_address.empty()) return options_.peer_address;
  if (!membership_.node_address.empty()) return membership_.node_address;
  return comm::GlooOptions{}.hostname;
}

absl::Status TrainerSession::Connect() {
  const int64_t rank = membership_.rank, world = membership_.world_size;
  const bool stage3 = membership_.plan->stage() == 3 && world > 1;
  // Every rank asks (the agreement is collective); every rank or none gets an exchange.
  std::shared_ptr<engine::ShardExchange> exchange;
  if (stage3 && device_ < 0) {
    int64_t shard_bytes = 0;
    for (const plan::Allocation& a : membership_.plan->Allocations()) {
      if (a.category == plan::MemoryCategory::kParams) shard_bytes = a.numel * a.element_bytes;
    }
    ZEROD_ASSIGN_OR_RETURN(exchange, engine::ShardExchange::Connect(
                                         *store_, "shards", rank, world, shard_bytes,
                                         options_.shard_exchange, options_.collective_timeout));
  }
  // Every rank creates the same communicators in the same order (each creation is collective).
  const bool gathers = options_.gather_communicator && stage3 && exchange == nullptr;
  // Makes one communicator of this session's backend, its rendezvous keys under `name`.
  std::function<absl::StatusOr<std::unique_ptr<comm::Communicator>>(const std::string&)> make;
  if (device_ < 0) {
    comm::GlooOptions gloo;
    gloo.timeout = options_.collective_timeout;
    gloo.hostname = PeerAddress();
    gloo.shared_memory = options_.shared_memory;
    gloo.background_start = options_.background_start;
    make = [this, rank, world, gloo](const std::string& name) {
      return comm::GlooCommunicator::Create(
          std::make_shared<comm::PrefixStore>("gloo" + name, store_), rank, world, gloo);
    };
  } else {
#if defined(ZEROD_HAVE_CUDA)
    ZEROD_ASSIGN_OR_RETURN(device_ops_, engine::CudaOps(device_));
    comm::NcclOptions nccl;
    nccl.device = device_;
    nccl.compute_stream = engine::CudaOpsStream(*device_ops_);
    nccl.timeout = options_.collective_timeout;
    make = [this, rank, world, nccl](const std::string& name) {
      return comm::NcclCommunicator::Create(
          std::make_shared<comm::PrefixStore>("nccl" + name, store_), rank, world, nccl);
    };
#endif
  }
  std::unique_ptr<comm::Communicator> main, gather;
  ZEROD_ASSIGN_OR_RETURN(main, make(""));
  if (gathers) {
    ZEROD_ASSIGN_OR_RETURN(gather, make("-gather"));
  }
  MutexLock lock(&mu_);
  communicator_ = std::move(main);
  gather_communicator_ = std::move(gather);
  shard_exchange_ = std::move(exchange);
  if (!lost_.ok()) AbortCommunicators(lost_);
  return absl::OkStatus();
}

void TrainerSession::AbortCommunicators(const absl::Status& why) {
  if (store_) store_->Abort(why);
  if (communicator_) communicator_->Abort(why);
  if (gather_communicator_) gather_communicator_->Abort(why);
  if (shard_exchange_) shard_exchange_->Abort(why);
}

absl::StatusOr<engine::ZeroEngine*> TrainerSession::CreateEngine(engine::EngineOptions options) {
  if (left_) return absl::FailedPreconditionError("create engine: the session has left its job");
  const absl::Status taken = absl::FailedPreconditionError(
      absl::StrCat("job ", options_.job_id, ": rank ", rank(), " already has an engine"));
  if (engine() != nullptr) return taken;  // before allocating a second engine's buffers
  options.device = device_ops_;
  options.gather_comm = gather_communicator_.get();
  options.shard_exchange = shard_exchange_;
  options.check_store = store_;
  options.collective_timeout = options_.collective_timeout;
  options.explain_failure = [this](const absl::Status& failure, bool wait) {
    return Explain(failure, wait);
  };
  ZEROD_ASSIGN_OR_RETURN(
      std::unique_ptr<engine::ZeroEngine> created,
      engine::ZeroEngine::Create(membership_.plan, communicator_.get(), std::move(options)));
  MutexLock lock(&mu_);
  if (engine_ != nullptr) return taken;  // another thread's CreateEngine won
  engine_ = std::move(created);
  return engine_.get();
}

engine::ZeroEngine* TrainerSession::engine() const {
  MutexLock lock(&mu_);
  return engine_.get();
}

HeartbeatReport TrainerSession::CurrentReport() const {
  HeartbeatReport report;
  const engine::ZeroEngine* e = engine();
  if (e == nullptr) return report;
  report.step = e->step();
  const plan::MemoryBreakdown memory = e->MemoryByCategory();
  for (int c = 0; c < plan::kMemoryCategoryCount; ++c) {
    report
        .memory_bytes[std::string(plan::MemoryCategoryName(static_cast<plan::MemoryCategory>(c)))] =
        memory.bytes[c];
  }
  report.comm_bytes = e->BytesSent();
  return report;
}

TrainerSession::~TrainerSession() {
  if (client_) client_->StopHeartbeats();  // none when Start failed before connecting
  // The communicators go first: destroying one ends its collectives (and joins its thread), so no
  // late transfer can land in engine buffers that are already freed.
  {
    MutexLock lock(&mu_);
    AbortCommunicators(absl::CancelledError("the trainer session ended"));
  }
  gather_communicator_.reset();
  communicator_.reset();
  MutexLock lock(&mu_);
  engine_.reset();
}

void TrainerSession::OnHeartbeat(const absl::StatusOr<v1::HeartbeatResponse>& reply) {
  absl::Status lost;
  if (!reply.ok()) {
    switch (reply.status().code()) {
      case absl::StatusCode::kFailedPrecondition:
        // This rank itself was declared lost (it was stopped past its lease, say) or removed:
        // the job went on without it, and nothing it computes counts now.
        lost = absl::AbortedError(absl::StrCat(
            reply.status().message(), " (the job went on without this rank; it cannot rejoin)"));
        break;
      case absl::StatusCode::kUnavailable:
        // Retried for the client's whole budget (ZEROD_RETRY_FOR): the daemon is gone, and the
        // lease of this rank with it.
        lost = absl::UnavailableError(
            absl::StrCat("job ", options_.job_id, ": rank ", membership_.rank,
                         " lost its coordinator: ", reply.status().message()));
        break;
      default:
        return;  // a slow answer: the next heartbeat may fare better
    }
  } else if (reply->lost_ranks_size() == 0 && reply->left_ranks_size() > 0) {
    // Not an abort: a rank leaves at the end of a run too, when the others may still finish
    // their last collective with what it sent. One that left early closed its connections, which
    // fails the others' collectives at once; this names the cause.
    MutexLock lock(&mu_);
    if (departed_.ok()) {
      departed_ = absl::AbortedError(
          absl::StrCat("job ", options_.job_id, ": rank ", absl::StrJoin(reply->left_ranks(), ", "),
                       reply->left_ranks_size() == 1 ? " has" : " have",
                       " left the job; generation is now ", reply->generation()));
    }
    return;
  } else if (reply->lost_ranks_size() > 0) {
    lost = absl::AbortedError(absl::StrCat(
        "job ", options_.job_id, ": rank ", absl::StrJoin(reply->lost_ranks(), ", "),
        reply->lost_ranks_size() == 1 ? " was" : " were", " lost (no heartbeat for ",
        absl::FormatDuration(membership_.lease_ttl), "); generation is now ", reply->generation()));
  } else {
    return;
  }
  MutexLock lock(&mu_);
  if (!lost_.ok()) return;
  lost_ = lost;
  AbortCommunicators(lost);
}

absl::Status TrainerSession::Explain(const absl::Status& failure, bool wait) {
  // Once this rank has left, no heartbeat brings news: what is known now is all there is.
  const absl::Duration patience =
      wait && !left_ ? 2 * membership_.lease_ttl + absl::Seconds(1) : absl::ZeroDuration();
  auto known = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !lost_.ok() || !departed_.ok(); };
  bool ask;
  {
    MutexLock lock(&mu_);
    ask = !left_ && !known();
  }
  if (ask) {
    // The coordinator knows at once of a rank that left (of a lost one only when its lease
    // ends): ask it now rather than at the next heartbeat, or the engine's order check waits
    // for the rank that left.
    OnHeartbeat(client_->Heartbeat(options_.job_id, membership_.rank, membership_.generation,
                                   CurrentReport()));
  }
  MutexLock lock(&mu_);
  if (mu_.AwaitWithTimeout(known, patience)) {
    const absl::Status& cause = lost_.ok() ? departed_ : lost_;
    // Never `failure` itself: the engine tells a known cause by the status changing.
    return absl::Status(
        cause.code(),
        absl::StrCat(cause.message(), " [",
                     cause == failure ? "collectives aborted" : failure.message(), "]"));
  }
  return failure;
}

absl::StatusOr<checkpoint::SavedCheckpoint> TrainerSession::SaveCheckpoint(
    checkpoint::SaveOptions options) {
  engine::ZeroEngine* e = engine();
  if (e == nullptr || left_) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", options_.job_id, ": save checkpoint: ",
                     left_ ? "the session has left its job" : "no engine yet (CreateEngine)"));
  }
  options.job_id = options_.job_id;
  return checkpoint::Save(*e, *store_, rank() == 0 ? recorder_.get() : nullptr, options);
}

absl::StatusOr<std::optional<checkpoint::LoadedCheckpoint>> TrainerSession::LoadCheckpoint(
    const std::string& path, absl::Duration timeout) {
  engine::ZeroEngine* e = engine();
  if (e == nullptr || left_) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", options_.job_id, ": load checkpoint: ",
                     left_ ? "the session has left its job" : "no engine yet (CreateEngine)"));
  }
  return checkpoint::LoadIfAny(*e, *store_, path, rank() == 0 ? recorder_.get() : nullptr, timeout);
}

absl::StatusOr<std::optional<checkpoint::LoadedCheckpoint>> TrainerSession::ResumeCheckpoint(
    const checkpoint::ResumeRoots& roots, absl::Duration timeout) {
  engine::ZeroEngine* e = engine();
  if (e == nullptr || left_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", options_.job_id,
        ": resume: ", left_ ? "the session has left its job" : "no engine yet (CreateEngine)"));
  }
  return checkpoint::LoadNewestIfAny(*e, *store_, roots, rank() == 0 ? recorder_.get() : nullptr,
                                     timeout);
}

absl::Status TrainerSession::Leave() {
  if (left_) return absl::OkStatus();
  left_ = true;
  client_->StopHeartbeats();
  // A last heartbeat, so what the job shows afterwards is the run's final state.
  (void)client_->Heartbeat(options_.job_id, membership_.rank, membership_.generation,
                           CurrentReport());
  auto generation = client_->Leave(options_.job_id, membership_.rank);
  {
    // A rank that leaves before the others (its script ended or failed) closes its connections
    // now, not when its process exits, if ever: their collectives with it fail at once, and the
    // coordinator, told first, names it when they ask. At the end of a run every collective is
    // complete and this changes nothing.
    MutexLock lock(&mu_);
    AbortCommunicators(absl::CancelledError(
        absl::StrCat("job ", options_.job_id, ": rank ", membership_.rank, " left the job")));
  }
  return generation.status();
}

}  // namespace zerod::client
