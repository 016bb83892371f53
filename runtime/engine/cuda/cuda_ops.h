#ifndef ZEROD_RUNTIME_ENGINE_CUDA_CUDA_OPS_H_
#define ZEROD_RUNTIME_ENGINE_CUDA_CUDA_OPS_H_

// DeviceOps on a GPU: buffers from plain cudaMalloc (never managed memory), every operation a
// kernel or copy on one compute stream. Give the same stream to the NCCL communicator
// (NcclOptions::compute_stream) so collectives start after the work queued here.

#include <cuda_runtime.h>

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/engine/device_ops.h"

namespace zerod::engine {

// Owns `stream` when it creates it (stream == nullptr: a new non-blocking stream).
absl::StatusOr<std::shared_ptr<DeviceOps>> CudaOps(int device, cudaStream_t stream = nullptr);

// The stream a CudaOps runs on.
cudaStream_t CudaOpsStream(const DeviceOps& ops);

// Free device memory now: the default memory budget of a rank that joins with a GPU.
absl::StatusOr<int64_t> FreeDeviceMemory(int device);

}  // namespace zerod::engine

#endif  // ZEROD_RUNTIME_ENGINE_CUDA_CUDA_OPS_H_
