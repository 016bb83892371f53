#ifndef ZEROD_CLIENT_TRAINER_SESSION_H_
#define ZEROD_CLIENT_TRAINER_SESSION_H_

// TrainerSession: what a trainer process does to take part in a zerod job, in one object. It
// joins (endpoint, job, rank and world size from the arguments or the ZEROD_* environment that
// zerorun sets), recomputes and verifies the plan, connects the communicators through the
// coordinator's store, and heartbeats with the engine's statistics. When the coordinator reports
// a lost member, it aborts the communicators so a rank blocked in a collective gets an error that
// names the lost rank instead of hanging.
//
// Device "cpu": Gloo, buffers in host memory. Device "cuda:N" (CUDA builds): the engine's buffers
// on GPU N (CudaOps) and NCCL ordered after the ops' stream. At stage 3 a second communicator
// carries the parameter gathers (EngineOptions::gather_comm) unless options say otherwise.
// Configure() puts all of it into the engine's options.
//
// Owns the client's heartbeat thread (stopped by Leave or the destructor) and the communicators;
// it must outlive the engine that uses them.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/coordinator_client.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
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
  // 0: unbounded on a CPU; on "cuda:N", what cudaMemGetInfo reports free (CUDA builds).
  int64_t budget_bytes = 0;
  std::vector<plan::TensorSpec> layout;
  plan::PlanOptions plan_options;
  absl::Duration join_timeout = absl::Minutes(10);
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration collective_timeout = absl::Seconds(120);
  // Stage 3: gathers on a communicator of their own (one more set of connections per rank), so
  // the prefetch of the next unit does not wait behind backward's reduce-scatters.
  bool gather_communicator = true;
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
  comm::Communicator* communicator() { return communicator_.get(); }
  // The stage-3 gather communicator, or nullptr.
  comm::Communicator* gather_communicator() { return gather_communicator_.get(); }
  // Where the engine's buffers live: nullptr for host memory, CudaOps on "cuda:N".
  std::shared_ptr<engine::DeviceOps> device_ops() const { return device_ops_; }
  // Sets the engine options that come from the session: device, gather communicator, the store
  // for collective-order checks, the collective timeout.
  void Configure(engine::EngineOptions& options);
  std::shared_ptr<comm::Store> store() { return store_; }
  CoordinatorClient& client() { return *client_; }

  // What the next heartbeats carry.
  void Report(HeartbeatReport report);

  // Turns a failed collective into the coordinator's account of it: waits (up to two lease
  // TTLs) for the coordinator to name a lost rank and returns that, else `failure` itself.
  absl::Status Explain(const absl::Status& failure);

  // Sends a last heartbeat with the latest report, stops heartbeating and leaves the job.
  absl::Status Leave();

 private:
  TrainerSession() = default;
  void OnHeartbeat(const absl::StatusOr<v1::HeartbeatResponse>& reply);

  SessionOptions options_;
  std::shared_ptr<CoordinatorClient> client_;
  Membership membership_;
  std::shared_ptr<comm::Store> store_;
  absl::Status Connect();
  void AbortCommunicators(const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::shared_ptr<engine::DeviceOps> device_ops_;
  int device_ = -1;  // the GPU on "cuda:N", else -1
  // Written once by Start (under mu_), read by the heartbeat thread under mu_.
  std::unique_ptr<comm::Communicator> communicator_;
  std::unique_ptr<comm::Communicator> gather_communicator_;
  bool left_ = false;

  absl::Mutex mu_;
  HeartbeatReport report_ ABSL_GUARDED_BY(mu_);
  absl::Status lost_ ABSL_GUARDED_BY(mu_);  // set once the coordinator reports a loss
};

}  // namespace zerod::client

#endif  // ZEROD_CLIENT_TRAINER_SESSION_H_
