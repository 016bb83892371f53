#include "runtime/comm/nccl/nccl_communicator.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/common/cuda/cuda_check.h"

namespace zerod::comm {
namespace {

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
  }
  return ncclFloat32;
}

// A collective's completion: an event on the comm stream, polled so that an abort or an NCCL
// error ends the wait.
class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator* owner, std::string name, cudaEvent_t event)
      : owner_(owner), name_(std::move(name)), event_(event) {}
  ~NcclWork() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }

  absl::Status Wait(absl::Duration timeout) override {
    if (!issue_error_.ok()) return issue_error_;
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      if (absl::Status a = owner_->aborted(); !a.ok()) return a;
      const cudaError_t e = cudaEventQuery(event_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) {
        return cuda::CudaStatus(e, "cudaEventQuery", __FILE__, __LINE__);
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat(name_, " did not complete within ", absl::FormatDuration(timeout)));
      }
      absl::SleepFor(absl::Microseconds(50));
    }
  }
  // The other ranks cannot skip a collective this one gives up on: unless it completed, the
  // communicator is aborted, which also ends its kernels before the buffers can be reused.
  void Abort(const absl::Status& why) override {
    if (event_ == nullptr || cudaEventQuery(event_) == cudaSuccess) return;
    owner_->Abort(why);
  }
  void set_issue_error(absl::Status s) { issue_error_ = std::move(s); }

 private:
  NcclCommunicator* owner_;
  std::string name_;
  cudaEvent_t event_;
  absl::Status issue_error_;
};

absl::StatusOr<ncclComm_t> InitComm(Store& store, int64_t rank, int64_t world,
                                    const NcclOptions& o) {
  ncclUniqueId id;
  if (rank == 0) {
    ZEROD_NCCL_CHECK(ncclGetUniqueId(&id));
    if (absl::Status s = store.Set("nccl_unique_id", std::string(id.internal, sizeof(id.internal)));
        !s.ok()) {
      return s;
    }
  } else {
    auto value = store.Get("nccl_unique_id", o.timeout);
    if (!value.ok()) return value.status();
    if (value->size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat("nccl unique id has ", value->size(), " bytes"));
    }
    std::memcpy(id.internal, value->data(), sizeof(id.internal));
  }
  ZEROD_CUDA_CHECK(cudaSetDevice(o.device));
  ncclComm_t comm = nullptr;
  ZEROD_NCCL_CHECK(ncclCommInitRank(&comm, static_cast<int>(world), id, static_cast<int>(rank)));
  return comm;
}

}  // namespace

void NcclCommunicator::OrderLaunchesAcrossCommunicators() {
  setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", /*overwrite=*/0);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<Store> store, int64_t rank, int64_t world_size, NcclOptions options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", rank, " is out of range for world size ", world_size));
  }
  auto comm = InitComm(*store, rank, world_size, options);
  if (!comm.ok()) return comm.status();
  cudaStream_t stream = nullptr;
  ZEROD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  float* scratch = nullptr;
  ZEROD_CUDA_CHECK(cudaMalloc(&scratch, sizeof(float)));
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(*comm, rank, world_size, options, stream, scratch));
}

NcclCommunicator::NcclCommunicator(ncclComm_t comm, int64_t rank, int64_t world_size,
                                   NcclOptions options, cudaStream_t stream, float* scratch)
    : comm_(comm),
      rank_(rank),
      world_size_(world_size),
      options_(options),
      stream_(stream),
      scratch_(scratch),
      watchdog_([this] { Watchdog(); }) {}

NcclCommunicator::~NcclCommunicator() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  watchdog_.join();
  bool aborted;
  {
    MutexLock lock(&mu_);
    aborted = !aborted_.ok();
  }
  if (!aborted) {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }
  cudaFree(scratch_);
  cudaStreamDestroy(stream_);
}

void NcclCommunicator::Watchdog() {
  MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; },
                         absl::Milliseconds(100));
    if (stopping_ || !aborted_.ok()) continue;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      aborted_ = absl::UnavailableError(
          absl::StrCat("nccl rank ", rank_, ": asynchronous error: ", ncclGetErrorString(async)));
      ncclCommAbort(comm_);
    }
  }
}

void NcclCommunicator::Abort(const absl::Status& why) {
  MutexLock lock(&mu_);
  if (!aborted_.ok()) return;
  aborted_ = why;
  // Unblocks every kernel of this communicator; the communicator is unusable afterwards.
  ncclCommAbort(comm_);
}

absl::Status NcclCommunicator::aborted() const {
  MutexLock lock(&mu_);
  return aborted_;
}

std::unique_ptr<Work> NcclCommunicator::Issue(const std::string& name, int64_t moved,
                                              const std::function<ncclResult_t()>& launch) {
  cudaEvent_t ready = nullptr, done = nullptr;
  absl::Status s = [&]() -> absl::Status {
    if (absl::Status a = aborted(); !a.ok()) return a;
    ZEROD_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    ZEROD_CUDA_CHECK(cudaEventRecord(ready, options_.compute_stream));
    ZEROD_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    ZEROD_NCCL_CHECK(launch());
    ZEROD_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    ZEROD_CUDA_CHECK(cudaEventRecord(done, stream_));
    return absl::OkStatus();
  }();
  if (ready != nullptr) cudaEventDestroy(ready);
  auto work = std::make_unique<NcclWork>(this, absl::StrCat(name, " on rank ", rank_), done);
  if (!s.ok()) {
    work->set_issue_error(s);
  } else {
    MutexLock lock(&mu_);
    sent_[name] += moved;
  }
  return work;
}

std::unique_ptr<Work> NcclCommunicator::AllReduce(void* data, int64_t count, DType dtype) {
  const int64_t bytes = count * DTypeBytes(dtype);
  return Issue("all_reduce", world_size_ > 1 ? 2 * (world_size_ - 1) * bytes / world_size_ : 0,
               [=, this] {
                 return ncclAllReduce(data, data, static_cast<size_t>(count), NcclType(dtype),
                                      ncclSum, comm_, stream_);
               });
}

std::unique_ptr<Work> NcclCommunicator::ReduceScatter(void* data, int64_t chunk_count,
                                                      DType dtype) {
  char* base = static_cast<char*>(data);
  const int64_t chunk_bytes = chunk_count * DTypeBytes(dtype);
  return Issue("reduce_scatter", (world_size_ - 1) * chunk_bytes, [=, this] {
    // In place: the output is this rank's chunk of the input.
    return ncclReduceScatter(base, base + rank_ * chunk_bytes, static_cast<size_t>(chunk_count),
                             NcclType(dtype), ncclSum, comm_, stream_);
  });
}

std::unique_ptr<Work> NcclCommunicator::AllGather(void* data, int64_t chunk_count, DType dtype) {
  char* base = static_cast<char*>(data);
  const int64_t chunk_bytes = chunk_count * DTypeBytes(dtype);
  return Issue("all_gather", (world_size_ - 1) * chunk_bytes, [=, this] {
    return ncclAllGather(base + rank_ * chunk_bytes, base, static_cast<size_t>(chunk_count),
                         NcclType(dtype), comm_, stream_);
  });
}

std::unique_ptr<Work> NcclCommunicator::Broadcast(void* data, int64_t count, DType dtype,
                                                  int64_t root) {
  const int64_t bytes = count * DTypeBytes(dtype);
  return Issue("broadcast", root == rank_ ? (world_size_ - 1) * bytes : 0, [=, this] {
    return ncclBroadcast(data, data, static_cast<size_t>(count), NcclType(dtype),
                         static_cast<int>(root), comm_, stream_);
  });
}

std::unique_ptr<Work> NcclCommunicator::Barrier() {
  return Issue("barrier", 0, [this] {
    return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_);
  });
}

std::map<std::string, int64_t> NcclCommunicator::BytesSent() const {
  MutexLock lock(&mu_);
  return sent_;
}

std::map<std::string, int64_t> NcclCommunicator::BytesReceived() const {
  // Ring collectives receive what they send.
  return BytesSent();
}

}  // namespace zerod::comm
