#ifndef ZEROD_RUNTIME_ENGINE_BUFFER_H_
#define ZEROD_RUNTIME_ENGINE_BUFFER_H_

// A zero-initialised buffer of one dtype in the memory of a DeviceOps (host or GPU), and element
// access in float for host memory.

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "runtime/common/dtype.h"
#include "runtime/common/half.h"
#include "runtime/engine/device_ops.h"

namespace zerod::engine {

class Buffer {
 public:
  Buffer() = default;
  static absl::StatusOr<Buffer> Allocate(std::shared_ptr<DeviceOps> ops, DType dtype,
                                         int64_t numel) {
    Buffer b;
    b.ops_ = std::move(ops);
    b.dtype_ = dtype;
    b.numel_ = numel;
    auto p = b.ops_->Allocate(b.Bytes());
    if (!p.ok()) return p.status();
    b.data_ = static_cast<char*>(*p);
    return b;
  }
  // A buffer over memory someone else owns (zero-filled, aligned as Allocate's), which it never
  // frees: a stage-3 shard in shared memory (ShardExchange).
  static Buffer Borrow(std::shared_ptr<DeviceOps> ops, DType dtype, int64_t numel, char* data) {
    Buffer b;
    b.ops_ = std::move(ops);
    b.dtype_ = dtype;
    b.numel_ = numel;
    b.data_ = data;
    b.owned_ = false;
    return b;
  }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    std::swap(ops_, other.ops_);
    std::swap(dtype_, other.dtype_);
    std::swap(numel_, other.numel_);
    std::swap(data_, other.data_);
    std::swap(owned_, other.owned_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (data_ != nullptr && owned_) ops_->Free(data_);
  }

  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  int64_t Bytes() const { return numel_ * DTypeBytes(dtype_); }
  char* data() { return data_; }
  const char* data() const { return data_; }
  // Address of element i.
  char* at(int64_t i) { return data_ + i * DTypeBytes(dtype_); }
  const char* at(int64_t i) const { return data_ + i * DTypeBytes(dtype_); }
  float* f32() { return reinterpret_cast<float*>(data_); }
  absl::Status Zero(int64_t begin, int64_t count) {
    return ops_->Zero(at(begin), count * DTypeBytes(dtype_));
  }
  // Copies `bytes` from host memory to the start of the buffer.
  absl::Status Upload(const void* host, int64_t bytes) { return ops_->Upload(data_, host, bytes); }

 private:
  std::shared_ptr<DeviceOps> ops_;
  DType dtype_ = DType::kFloat32;
  int64_t numel_ = 0;
  char* data_ = nullptr;
  bool owned_ = true;
};

inline float LoadAs(DType dtype, const void* base, int64_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DType::kBFloat16:
      return Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat16:
      return Fp16ToFloat(static_cast<const uint16_t*>(base)[i]);
  }
  return 0;
}

inline void StoreAs(DType dtype, void* base, int64_t i, float value) {
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(base)[i] = value;
      return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[i] = FloatToBf16(value);
      return;
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[i] = FloatToFp16(value);
      return;
  }
}

}  // namespace zerod::engine

#endif  // ZEROD_RUNTIME_ENGINE_BUFFER_H_
