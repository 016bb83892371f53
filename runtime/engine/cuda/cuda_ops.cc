#include "runtime/engine/cuda/cuda_ops.h"

#include <cmath>
#include <vector>

#include "runtime/common/cuda/cuda_check.h"
#include "runtime/optim/cuda/adam_cuda.h"

namespace zerod::engine {
namespace {

class Cuda final : public DeviceOps {
 public:
  Cuda(int device, cudaStream_t stream, bool owns)
      : device_(device), stream_(stream), owns_(owns) {}
  ~Cuda() override {
    if (owns_) cudaStreamDestroy(stream_);
  }
  bool on_device() const override { return true; }
  cudaStream_t stream() const { return stream_; }

  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    ZEROD_CUDA_CHECK(cudaSetDevice(device_));
    void* p = nullptr;
    ZEROD_CUDA_CHECK(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
    ZEROD_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream_));
    return p;
  }
  void Free(void* p) override {
    cudaStreamSynchronize(stream_);
    cudaFree(p);
  }
  absl::Status Zero(void* p, int64_t bytes) override {
    ZEROD_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<size_t>(bytes), stream_));
    return absl::OkStatus();
  }
  absl::Status Copy(void* dst, const void* src, int64_t bytes) override {
    ZEROD_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }
  absl::Status Upload(void* dst, const void* src, int64_t bytes) override {
    ZEROD_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, stream_));
    // The host buffer may be gone once we return.
    ZEROD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  absl::Status Download(void* dst, const void* src, int64_t bytes) override {
    ZEROD_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, stream_));
    ZEROD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  absl::Status AddFloat(DType dtype, void* dst, const float* src, int64_t n) override {
    return optim::cuda::AddFloat(dst, dtype, src, n, stream_);
  }
  absl::Status AddSame(DType dtype, void* dst, const void* src, int64_t n) override {
    return optim::cuda::AddSame(dst, dtype, src, n, stream_);
  }
  absl::Status SumSquares(DType dtype, const void* p, int64_t n, double* sum,
                          bool* nonfinite) override {
    if (n == 0) return absl::OkStatus();
    const int blocks = optim::cuda::SquaredNormBlocks(n);
    float* partials = nullptr;
    ZEROD_CUDA_CHECK(
        cudaMallocAsync(&partials, static_cast<size_t>(blocks) * sizeof(float), stream_));
    absl::Status s = optim::cuda::SquaredNormPartials(p, dtype, n, partials, stream_);
    std::vector<float> host(static_cast<size_t>(blocks));
    if (s.ok()) s = Download(host.data(), partials, blocks * static_cast<int64_t>(sizeof(float)));
    cudaFreeAsync(partials, stream_);
    if (!s.ok()) return s;
    double local = 0;
    for (float x : host) local += x;
    // inf and NaN survive squaring and summing: a non-finite sum means a non-finite gradient.
    if (!std::isfinite(local)) *nonfinite = true;
    *sum += local;
    return absl::OkStatus();
  }
  absl::Status Adam(const std::vector<optim::AdamRun>& runs) override {
    return optim::cuda::AdamStep(runs, stream_);
  }
  absl::Status Synchronize() override {
    ZEROD_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

 private:
  int device_;
  cudaStream_t stream_;
  bool owns_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<DeviceOps>> CudaOps(int device, cudaStream_t stream) {
  ZEROD_CUDA_CHECK(cudaSetDevice(device));
  const bool owns = stream == nullptr;
  if (owns) ZEROD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return std::shared_ptr<DeviceOps>(std::make_shared<Cuda>(device, stream, owns));
}

cudaStream_t CudaOpsStream(const DeviceOps& ops) { return static_cast<const Cuda&>(ops).stream(); }

absl::StatusOr<int64_t> FreeDeviceMemory(int device) {
  ZEROD_CUDA_CHECK(cudaSetDevice(device));
  size_t free = 0, total = 0;
  ZEROD_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

}  // namespace zerod::engine
