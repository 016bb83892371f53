#ifndef ZEROD_RUNTIME_ENGINE_DEVICE_OPS_H_
#define ZEROD_RUNTIME_ENGINE_DEVICE_OPS_H_

// DeviceOps: where the engine's buffers live and the few element operations it performs on them.
// HostOps keeps them in host memory (the CPU runtime, with Gloo); CudaOps (runtime/engine/cuda/)
// keeps them in GPU memory, allocated with plain cudaMalloc, and runs the same operations as
// kernels on one compute stream (the runtime with NCCL). Pointers passed in are in the ops'
// memory unless the name says host.

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/common/dtype.h"
#include "runtime/common/thread_pool.h"
#include "runtime/optim/adam.h"

namespace zerod::engine {

class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  virtual bool on_device() const = 0;

  // Zero-filled, 64-byte aligned (256 on a GPU).
  virtual absl::StatusOr<void*> Allocate(int64_t bytes) = 0;
  virtual void Free(void* p) = 0;
  virtual absl::Status Zero(void* p, int64_t bytes) = 0;
  virtual absl::Status Copy(void* dst, const void* src, int64_t bytes) = 0;
  virtual absl::Status Upload(void* dst, const void* host_src, int64_t bytes) = 0;
  virtual absl::Status Download(void* host_dst, const void* src, int64_t bytes) = 0;
  // dst[i] += src[i]: `src` fp32, `dst` in `dtype`.
  virtual absl::Status AddFloat(DType dtype, void* dst, const float* src, int64_t n) = 0;
  // dst[i] += src[i], both in `dtype`.
  virtual absl::Status AddSame(DType dtype, void* dst, const void* src, int64_t n) = 0;
  // Adds the squares of n elements to *sum and notes any inf or NaN (synchronous).
  virtual absl::Status SumSquares(DType dtype, const void* p, int64_t n, double* sum,
                                  bool* nonfinite) = 0;
  // The optimizer step on every run, each with its own scalars (optim::AdamStep).
  virtual absl::Status Adam(const std::vector<optim::AdamRun>& runs) = 0;
  // Waits for everything queued (device work before the host reads or a collective).
  virtual absl::Status Synchronize() = 0;
};

// Host memory; Adam on `pool`'s threads when given.
std::shared_ptr<DeviceOps> HostOps(std::shared_ptr<ThreadPool> pool = nullptr);

}  // namespace zerod::engine

#endif  // ZEROD_RUNTIME_ENGINE_DEVICE_OPS_H_
