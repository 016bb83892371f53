#ifndef ZEROD_RUNTIME_COMMON_CUDA_CUDA_CHECK_H_
#define ZEROD_RUNTIME_COMMON_CUDA_CUDA_CHECK_H_

// Every CUDA and NCCL call goes through these: a failure becomes a Status naming the call, the
// file and the line (NCCL's NCCLCHECK), returned from the enclosing function.

#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace zerod::cuda {

inline absl::Status CudaStatus(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(file, ":", line, ": ", call, ": ", cudaGetErrorName(e),
                                          " (", cudaGetErrorString(e), ")"));
}

inline absl::Status NcclStatus(ncclResult_t r, const char* call, const char* file, int line) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  const absl::StatusCode code = r == ncclRemoteError || r == ncclSystemError
                                    ? absl::StatusCode::kUnavailable
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(file, ":", line, ": ", call, ": ", ncclGetErrorString(r)));
}

}  // namespace zerod::cuda

#define ZEROD_CUDA_CHECK(call)                                        \
  do {                                                                \
    ::absl::Status zerod_cuda_status_ =                               \
        ::zerod::cuda::CudaStatus((call), #call, __FILE__, __LINE__); \
    if (!zerod_cuda_status_.ok()) return zerod_cuda_status_;          \
  } while (false)

#define ZEROD_NCCL_CHECK(call)                                        \
  do {                                                                \
    ::absl::Status zerod_nccl_status_ =                               \
        ::zerod::cuda::NcclStatus((call), #call, __FILE__, __LINE__); \
    if (!zerod_nccl_status_.ok()) return zerod_nccl_status_;          \
  } while (false)

#endif  // ZEROD_RUNTIME_COMMON_CUDA_CUDA_CHECK_H_
