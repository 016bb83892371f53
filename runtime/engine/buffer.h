#ifndef ZEROD_RUNTIME_ENGINE_BUFFER_H_
#define ZEROD_RUNTIME_ENGINE_BUFFER_H_

// A zero-initialised, 64-byte aligned host buffer of one dtype, and element access in float.

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "runtime/common/dtype.h"
#include "runtime/common/half.h"

namespace zerod::engine {

class Buffer {
 public:
  Buffer() = default;
  Buffer(DType dtype, int64_t numel)
      : dtype_(dtype),
        numel_(numel),
        data_(static_cast<char*>(::operator new[](Bytes(), std::align_val_t(64)))) {
    std::memset(data_.get(), 0, static_cast<size_t>(Bytes()));
  }

  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  int64_t Bytes() const { return numel_ * DTypeBytes(dtype_); }
  char* data() { return data_.get(); }
  const char* data() const { return data_.get(); }
  // Address of element i.
  char* at(int64_t i) { return data_.get() + i * DTypeBytes(dtype_); }
  const char* at(int64_t i) const { return data_.get() + i * DTypeBytes(dtype_); }
  float* f32() { return reinterpret_cast<float*>(data_.get()); }
  void Zero(int64_t begin, int64_t count) {
    std::memset(at(begin), 0, static_cast<size_t>(count * DTypeBytes(dtype_)));
  }

 private:
  struct AlignedDelete {
    void operator()(char* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  DType dtype_ = DType::kFloat32;
  int64_t numel_ = 0;
  std::unique_ptr<char[], AlignedDelete> data_;
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
