// DeviceOps in host memory: what the CPU runtime runs.

#include <cmath>
#include <cstring>
#include <new>

#include "runtime/engine/buffer.h"
#include "runtime/engine/device_ops.h"

namespace zerod::engine {
namespace {

class Host final : public DeviceOps {
 public:
  explicit Host(std::shared_ptr<ThreadPool> pool) : pool_(std::move(pool)) {}
  bool on_device() const override { return false; }

  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    void* p =
        ::operator new[](static_cast<size_t>(std::max<int64_t>(bytes, 1)), std::align_val_t(64));
    std::memset(p, 0, static_cast<size_t>(bytes));
    return p;
  }
  void Free(void* p) override { ::operator delete[](p, std::align_val_t(64)); }
  absl::Status Zero(void* p, int64_t bytes) override {
    std::memset(p, 0, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status Copy(void* dst, const void* src, int64_t bytes) override {
    std::memmove(dst, src, static_cast<size_t>(bytes));
    return absl::OkStatus();
  }
  absl::Status Upload(void* dst, const void* src, int64_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status Download(void* dst, const void* src, int64_t bytes) override {
    return Copy(dst, src, bytes);
  }
  absl::Status AddFloat(DType dtype, void* dst, const float* src, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) StoreAs(dtype, dst, i, LoadAs(dtype, dst, i) + src[i]);
    return absl::OkStatus();
  }
  absl::Status AddSame(DType dtype, void* dst, const void* src, int64_t n) override {
    if (dtype == DType::kFloat32) {
      float* d = static_cast<float*>(dst);
      const float* s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) d[i] += s[i];
      return absl::OkStatus();
    }
    for (int64_t i = 0; i < n; ++i) {
      StoreAs(dtype, dst, i, LoadAs(dtype, dst, i) + LoadAs(dtype, src, i));
    }
    return absl::OkStatus();
  }
  absl::Status SumSquares(DType dtype, const void* p, int64_t n, double* sum,
                          bool* nonfinite) override {
    for (int64_t i = 0; i < n; ++i) {
      const double x = LoadAs(dtype, p, i);
      if (!std::isfinite(x)) *nonfinite = true;
      *sum += x * x;
    }
    return absl::OkStatus();
  }
  absl::Status Adam(const std::vector<optim::AdamRun>& runs) override {
    optim::AdamStep(runs, isa_, pool_.get());
    return absl::OkStatus();
  }
  absl::Status Synchronize() override { return absl::OkStatus(); }

 private:
  std::shared_ptr<ThreadPool> pool_;
  const optim::Isa isa_ = optim::BestIsa();
};

}  // namespace

std::shared_ptr<DeviceOps> HostOps(std::shared_ptr<ThreadPool> pool) {
  return std::make_shared<Host>(std::move(pool));
}

}  // namespace zerod::engine
