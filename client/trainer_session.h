#ifndef ZEROD_CLIENT_TRAINER_SESSION_H_
#define ZEROD_CLIENT_TRAINER_SESSION_H_

// TrainerSession: what a trainer process does to take part in a zerod job, in one object. It
// joins (endpoint, job, rank and world size from the arguments or the ZEROD_* environment that
// zerorun sets), recomputes and verifies the plan, connects the communicators through the
// coordinator's store, and heartbeats with the engine's statistics. When the coordinator reports
// a lost member, it aborts the communicators so a rank blocked in a collective gets an error that
// names the lost rank instead of hanging; the same when the coordinator says this rank itself was
// declared lost (it resumed after a stop), and when the daemon stayed unreachable for the
// client's whole retry budget ($ZEROD_RETRY_FOR, default 60s). A rank that left is named when a
// collective fails (its Leave closed its connections).
//
// Device "cpu": Gloo, buffers in host memory. Device "cuda:N" (CUDA builds): the engine's buffers
// on GPU N (CudaOps) and NCCL ordered after the ops' stream. At stage 3 a second communicator
// carries the parameter gathers (EngineOptions::gather_comm) unless options say otherwise.
//
// The session makes the engine (CreateEngine), so the wiring cannot be forgotten: the plan, the
// communicators, the device, the store for collective-order checks and the timeout come from the
// session. From then on the heartbeats carry the engine's step, memory by category and bytes
// sent, read from the engine itself, and every collective that fails inside the engine comes
// back explained: when the coordinator names a lost rank, the error says so.
//
//   auto session = TrainerSession::Start(options);          // join, plan, communicators
//   auto engine = (*session)->CreateEngine(engine_options);   // owned by the session
//   ... Gather / Param / AccumulateGrad / Step on *engine ...
//   (*session)->Leave();
//
// Owns the client's heartbeat thread (stopped by Leave or the destructor), the communicators and
// the engine. The communicators are destroyed first, which ends their collectives, so no late
// transfer can land in the engine's freed buffers.

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/checkpoint_recorder.h"
#include "client/coordinator_client.h"
#include "runtime/checkpoint/save_protocol.h"
#include "runtime/comm/abortable_store.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/common/mutex.h"
#include "runtime/engine/device_ops.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/plan/shard_plan.h"

namespace zerod::client {

// A device name: "cpu" is -1; "cuda:N" is GPU N; plain "cuda" is GPU $ZEROD_LOCAL_RANK (zerorun
// sets it: one GPU per local rank, as torchrun's LOCAL_RANK), else 0. Anything else is an error
// that says what is expected.
absl::StatusOr<int> ParseDevice(const std::string& device);

struct SessionOptions {
  std::string endpoint;        // default $ZEROD_ENDPOINT
  std::string job_id;          // default $ZEROD_JOB
  int64_t rank = -2;           // default $ZEROD_RANK, else any
  int64_t world_size = 0;      // default $ZEROD_WORLD_SIZE
  std::string device = "cpu";  // or "cuda", "cuda:N" (ParseDevice)
  // The job's token; empty: $ZEROD_JOB_TOKEN, else the user's saved one (client/credentials.h).
  std::string job_token;
  // The address this rank's peers reach it by (Gloo); empty: see TrainerSession::PeerAddress.
  std::string peer_address;
  // 0: unbounded on a CPU; on "cuda:N", what cudaMemGetInfo reports free (CUDA builds).
  int64_t budget_bytes = 0;
  std::vector<plan::TensorSpec> layout;
  plan::PlanOptions plan_options;
  // Settings outside the plan every rank must give alike, checked at join (the trainer's
  // optimizer hyperparameters): name -> canonical text.
  std::map<std::string, std::string> agreed_options;
  absl::Duration join_timeout = absl::Minutes(10);
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration collective_timeout = absl::Seconds(120);
  // Stage 3: gathers on a communicator of their own (one more set of connections per rank), so
  // the prefetch of the next unit does not wait behind backward's reduce-scatters.
  bool gather_communicator = true;
  // Stage 3, host memory, every rank on one host: gathers copy the peers' parameter shards from
  // shared memory instead of all-gathering them (engine::ShardExchange), so ranks may gather
  // different units, and no gather communicator is made. $ZEROD_GLOO_SHARD_EXCHANGE=0 turns it off.
  bool shard_exchange = true;
  // Gloo: ranks that all run on one host move large collectives through shared memory
  // (GlooOptions::shared_memory). $ZEROD_GLOO_SHARED_MEMORY=0 turns it off, =1 leaves it on.
  bool shared_memory = true;
  // Gloo: whether a collective the engine starts runs on the collective thread at once
  // (GlooOptions::background_start). Unset: where the ranks on this host leave a CPU free.
  // $ZEROD_GLOO_BACKGROUND_START=0 or 1 sets it.
  std::optional<bool> background_start;
};

class TrainerSession {
 public:
  static absl::StatusOr<std::unique_ptr<TrainerSession>> Start(SessionOptions options);
  ~TrainerSession();

  int64_t rank() const { return membership_.rank; }
  int64_t world_size() const { return membership_.world_size; }
  int64_t generation() const { return membership_.generation; }
  const std::string& job_id() const { return options_.job_id; }
  const std::string& device() const { return options_.device; }  // "cpu" or "cuda:N"
  std::shared_ptr<const plan::ShardPlan> plan() const { return membership_.plan; }
  // The address this rank's peers connect to on a CPU (Gloo): $ZEROD_GLOO_HOST, else
  // SessionOptions::peer_address, else the address its node's zerod gave at the join (its
  // --advertise host, or its --listen host in a cluster), else 127.0.0.1 (ranks of one machine
  // only).
  std::string PeerAddress() const;
  // Whether stage-3 gathers run on a communicator of their own.
  bool has_gather_communicator() const { return gather_communicator_ != nullptr; }
  // Whether stage-3 gathers copy the peers' shards from shared memory (SessionOptions).
  bool has_shard_exchange() const { return shard_exchange_ != nullptr; }
  // Whether the collectives move large buffers through shared memory (Gloo, every rank on this
  // host, SessionOptions::shared_memory on).
  bool uses_shared_memory() const;
  // Whether collectives the engine starts run on the collective thread at once (Gloo,
  // SessionOptions::background_start or what the communicator chose).
  bool starts_collectives_in_background() const;
  // Pieces of collectives moved through shared memory so far (GlooCommunicator::SharedMemoryPieces
  // of the session's communicators).
  int64_t shared_memory_pieces() const;
  // Where the engine's buffers live: nullptr for host memory, CudaOps on "cuda:N". A model that
  // computes on the host uploads its gradients through a buffer allocated with these ops.
  std::shared_ptr<engine::DeviceOps> device_ops() const { return device_ops_; }

  // Creates this session's engine. From `options` come the optimizer, loss scaling, clipping,
  // accumulation and thread settings; the session sets the rest (device, gather communicator,
  // check store, collective timeout, failure explanation), overriding what `options` says of
  // them. One engine per session: a second call is FAILED_PRECONDITION. The engine lives until
  // the session is destroyed.
  absl::StatusOr<engine::ZeroEngine*> CreateEngine(engine::EngineOptions options);
  engine::ZeroEngine* engine() const;

  // Sharded checkpoints of this session's engine (runtime/checkpoint/save_protocol.h): every rank
  // calls them at the same step, after CreateEngine. The waits go through this generation's store,
  // and rank 0 records each checkpoint with the coordinator (`zeroctl checkpoints JOB` lists them),
  // whose records also decide which checkpoints Load counts as complete. SaveCheckpoint fills in
  // options.job_id.
  absl::StatusOr<checkpoint::SavedCheckpoint> SaveCheckpoint(checkpoint::SaveOptions options);
  // Loads `path` (a checkpoint directory, or a root whose newest complete checkpoint is taken),
  // resharded to this job's world and stage. nullopt on every rank when `path` is a root holding
  // no complete checkpoint yet: the first run of a trainer that resumes when it can.
  absl::StatusOr<std::optional<checkpoint::LoadedCheckpoint>> LoadCheckpoint(
      const std::string& path, absl::Duration timeout = absl::Minutes(10));
  // The newest complete checkpoint of the in-memory snapshots and the durable roots (a snapshot
  // wins a tie), as LoadCheckpoint loads one: what a restarted trainer resumes from. Unrecorded
  // snapshots count in `roots.snapshots` alone.
  absl::StatusOr<std::optional<checkpoint::LoadedCheckpoint>> ResumeCheckpoint(
      const checkpoint::ResumeRoots& roots, absl::Duration timeout = absl::Minutes(10));

  // Closes the communicators (the engine's collectives fail from now on, and so do the other
  // ranks' collectives with this one), sends a last heartbeat with the engine's final state,
  // stops heartbeating and leaves the job.
  absl::Status Leave();

 private:
  TrainerSession() = default;
  absl::Status Connect();
  void OnHeartbeat(const absl::StatusOr<v1::HeartbeatResponse>& reply);
  // What the next heartbeat carries: the engine's statistics, once there is an engine.
  HeartbeatReport CurrentReport() const;
  // Aborts the communicators and the store's waits.
  void AbortCommunicators(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Turns a failed collective into the coordinator's account of it: a lost rank the coordinator
  // has named, else (with `wait`, before Leave) waits up to two lease TTLs for it to name one, else
  // `failure` itself.
  absl::Status Explain(const absl::Status& failure, bool wait);

  SessionOptions options_;
  std::shared_ptr<CoordinatorClient> client_;
  Membership membership_;
  std::shared_ptr<comm::AbortableStore> store_;
  std::unique_ptr<CheckpointRecorder> recorder_;  // used on rank 0
  std::shared_ptr<engine::DeviceOps> device_ops_;
  int device_ = -1;  // the GPU on "cuda:N", else -1
  // Set by Start before the heartbeat thread could abort them (under mu_), then only read.
  std::unique_ptr<comm::Communicator> communicator_;
  std::unique_ptr<comm::Communicator> gather_communicator_;
  std::shared_ptr<engine::ShardExchange> shard_exchange_;
  std::atomic<bool> left_ = false;

  mutable Mutex mu_;
  // Set once by CreateEngine; the heartbeat thread reads its thread-safe statistics.
  std::unique_ptr<engine::ZeroEngine> engine_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_ ABSL_GUARDED_BY(mu_);  // set once the coordinator reports a loss
  // Set once the coordinator reports ranks that left: a cause for Explain, not an abort.
  absl::Status departed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zerod::client

#endif  // ZEROD_CLIENT_TRAINER_SESSION_H_
