#ifndef ZEROD_RUNTIME_COMM_NCCL_NCCL_COMMUNICATOR_H_
#define ZEROD_RUNTIME_COMM_NCCL_NCCL_COMMUNICATOR_H_

// The Communicator on NCCL, for device memory.
//
// The ncclUniqueId travels through a comm::Store (the coordinator's in real runs). Collectives
// run on a dedicated communication stream, ordered after the work already queued on the caller's
// compute stream by an event; each Work is an event recorded after the collective. A watchdog
// thread polls ncclCommGetAsyncError; on an NCCL error, or on Abort (a lost member, a timeout),
// the communicator is aborted with ncclCommAbort so waiters get an error, not a hang.
//
// Owns the watchdog thread (stopped by the destructor), the stream and the communicator.

#include <cuda_runtime.h>
#include <nccl.h>

#include <map>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/common/mutex.h"

namespace zerod::comm {

struct NcclOptions {
  int device = 0;
  cudaStream_t compute_stream = nullptr;        // collectives start after its queued work
  absl::Duration timeout = absl::Seconds(120);  // rendezvous
};

class NcclCommunicator final : public Communicator {
 public:
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(std::shared_ptr<Store> store,
                                                                  int64_t rank, int64_t world_size,
                                                                  NcclOptions options);
  ~NcclCommunicator() override;

  // Two communicators in use at once on one GPU (the engine's main and stage-3 gather ones) can
  // deadlock: NCCL kernels block until their peers arrive, and nothing makes the device run the
  // two communicators' kernels in the same order on every rank. NCCL (2.26 and later) runs them
  // in host launch order when NCCL_LAUNCH_ORDER_IMPLICIT=1, and the engine launches in the same
  // order on every rank, so that is enough. Sets the variable unless the environment already
  // does; call it before creating the first communicator, while no other thread reads the
  // environment.
  static void OrderLaunchesAcrossCommunicators();

  int64_t rank() const override { return rank_; }
  int64_t world_size() const override { return world_size_; }
  std::unique_ptr<Work> AllReduce(void* data, int64_t count, DType dtype) override;
  std::unique_ptr<Work> ReduceScatter(void* data, int64_t chunk_count, DType dtype) override;
  std::unique_ptr<Work> AllGather(void* data, int64_t chunk_count, DType dtype) override;
  std::unique_ptr<Work> Broadcast(void* data, int64_t count, DType dtype, int64_t root) override;
  std::unique_ptr<Work> Barrier() override;
  void Abort(const absl::Status& why) override;
  std::map<std::string, int64_t> BytesSent() const override;
  std::map<std::string, int64_t> BytesReceived() const override;

  cudaStream_t comm_stream() const { return stream_; }
  // The abort reason, or OK.
  absl::Status aborted() const;

 private:
  NcclCommunicator(ncclComm_t comm, int64_t rank, int64_t world_size, NcclOptions options,
                   cudaStream_t stream, float* scratch);
  // Orders the comm stream after the compute stream, runs `launch`, records the Work's event.
  std::unique_ptr<Work> Issue(const std::string& name, int64_t moved,
                              const std::function<ncclResult_t()>& launch);
  void Watchdog();

  ncclComm_t comm_;
  const int64_t rank_;
  const int64_t world_size_;
  const NcclOptions options_;
  cudaStream_t stream_;
  float* scratch_;  // one float for Barrier

  mutable Mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, int64_t> sent_ ABSL_GUARDED_BY(mu_);
  std::thread watchdog_;
};

}  // namespace zerod::comm

#endif  // ZEROD_RUNTIME_COMM_NCCL_NCCL_COMMUNICATOR_H_
