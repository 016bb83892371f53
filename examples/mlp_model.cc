#include "examples/mlp_model.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace zerod::examples {
namespace {

uint64_t Mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x7f4a7c159e3779b9ull);
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

}  // namespace

std::vector<plan::TensorSpec> MlpLayout(const MlpShape& shape, DType dtype) {
  std::vector<plan::TensorSpec> tensors;
  for (int64_t l = 0; l < shape.layers; ++l) {
    const std::string unit = absl::StrCat("layer", l);
    tensors.push_back({unit + ".weight", {shape.In(l), shape.Out(l)}, dtype, unit});
    tensors.push_back({unit + ".bias", {shape.Out(l)}, dtype, unit});
  }
  return tensors;
}

void MlpInit(const MlpShape& shape, uint64_t seed, int64_t tensor, float* out) {
  const int64_t layer = tensor / 2;
  const bool bias = tensor % 2 == 1;
  const int64_t n = bias ? shape.Out(layer) : shape.In(layer) * shape.Out(layer);
  const float scale = bias ? 0.01f : 1.0f / std::sqrt(static_cast<float>(shape.In(layer)));
  std::mt19937_64 rng(Mix(seed, static_cast<uint64_t>(tensor)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) out[i] = normal(rng) * scale;
}

Dataset::Dataset(const MlpShape& shape, uint64_t seed) : shape_(shape), seed_(seed) {
  for (int64_t l = 0; l < shape.layers; ++l) {
    weights_.emplace_back(static_cast<size_t>(shape.In(l) * shape.Out(l)));
    biases_.emplace_back(static_cast<size_t>(shape.Out(l)));
    MlpInit(shape, Mix(seed, 0x7eac4e2), 2 * l, weights_.back().data());
    MlpInit(shape, Mix(seed, 0x7eac4e2), 2 * l + 1, biases_.back().data());
  }
}

void Dataset::Teacher(const float* x, float* y) const {
  std::vector<float> a(x, x + shape_.inputs), next;
  for (int64_t l = 0; l < shape_.layers; ++l) {
    const std::vector<float>& w = weights_[static_cast<size_t>(l)];
    next.assign(static_cast<size_t>(shape_.Out(l)), 0.0f);
    for (int64_t j = 0; j < shape_.Out(l); ++j) next[j] = biases_[static_cast<size_t>(l)][j] * 4;
    for (int64_t i = 0; i < shape_.In(l); ++i) {
      for (int64_t j = 0; j < shape_.Out(l); ++j) next[j] += a[i] * w[i * shape_.Out(l) + j] * 2;
    }
    if (l < shape_.layers - 1) {
      for (float& v : next) v = std::tanh(v);
    }
    a.swap(next);
  }
  for (int64_t j = 0; j < shape_.outputs; ++j) y[j] = a[j];
}

Batch Dataset::Make(int64_t step, int64_t first, int64_t count) const {
  Batch b;
  b.size = count;
  b.x.resize(static_cast<size_t>(count * shape_.inputs));
  b.t.resize(static_cast<size_t>(count * shape_.outputs));
  for (int64_t s = 0; s < count; ++s) {
    std::mt19937_64 rng(
        Mix(Mix(seed_, static_cast<uint64_t>(step)), static_cast<uint64_t>(first + s)));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < shape_.inputs; ++i) b.x[s * shape_.inputs + i] = normal(rng);
    Teacher(&b.x[s * shape_.inputs], &b.t[s * shape_.outputs]);
  }
  return b;
}

namespace {

// Hands a host gradient to the engine, through `staging` when the engine is on a GPU.
absl::Status AddGrad(engine::ZeroEngine& e, int64_t tensor, const std::vector<float>& grad,
                     engine::Buffer* staging) {
  if (staging == nullptr) return e.AccumulateGrad(tensor, grad.data());
  ZEROD_RETURN_IF_ERROR(
      staging->Upload(grad.data(), static_cast<int64_t>(grad.size() * sizeof(float))));
  // The engine's kernel reads the staging buffer on the ops' stream before the next upload.
  return e.AccumulateGrad(tensor, staging->f32());
}

}  // namespace

absl::StatusOr<double> TrainMicroStep(const MlpShape& shape, engine::ZeroEngine& e,
                                      const Batch& batch, MicroStepBuffers& buffers,
                                      engine::Buffer* device_staging) {
  const int64_t n = batch.size, L = shape.layers;
  std::vector<std::vector<float>>& acts = buffers.acts;
  acts.resize(static_cast<size_t>(L + 1));
  acts[0].assign(batch.x.begin(), batch.x.end());
  std::vector<float>& w = buffers.w;
  std::vector<float>& b = buffers.b;
  // Forward.
  for (int64_t l = 0; l < L; ++l) {
    const int64_t in = shape.In(l), out = shape.Out(l);
    ZEROD_RETURN_IF_ERROR(e.Gather(e.UnitOf(2 * l)));
    w.resize(static_cast<size_t>(in * out));
    b.resize(static_cast<size_t>(out));
    ZEROD_RETURN_IF_ERROR(e.ParamToFloat(2 * l, w.data()));
    ZEROD_RETURN_IF_ERROR(e.ParamToFloat(2 * l + 1, b.data()));
    ZEROD_RETURN_IF_ERROR(e.Release(e.UnitOf(2 * l)));
    std::vector<float>& a = acts[static_cast<size_t>(l)];
    std::vector<float>& z = acts[static_cast<size_t>(l + 1)];
    z.assign(static_cast<size_t>(n * out), 0.0f);
    for (int64_t s = 0; s < n; ++s) {
      float* zs = &z[s * out];
      for (int64_t j = 0; j < out; ++j) zs[j] = b[j];
      for (int64_t i = 0; i < in; ++i) {  // row-major walk over w: contiguous
        const float x = a[s * in + i];
        const float* wi = &w[i * out];
        for (int64_t j = 0; j < out; ++j) zs[j] += x * wi[j];
      }
      if (l < L - 1) {
        for (int64_t j = 0; j < out; ++j) zs[j] = std::tanh(zs[j]);
      }
    }
  }
  // Loss: mean squared error over the batch's outputs.
  const std::vector<float>& y = acts[static_cast<size_t>(L)];
  const double denom = static_cast<double>(n * shape.outputs);
  double loss = 0;
  const float scale = static_cast<float>(e.loss_scale());
  std::vector<float>& delta = buffers.delta;
  delta.resize(y.size());
  for (size_t k = 0; k < y.size(); ++k) {
    const double d = static_cast<double>(y[k]) - batch.t[k];
    loss += d * d / denom;
    delta[k] = static_cast<float>(2.0 * d / denom) * scale;
  }
  // Backward, last layer first.
  std::vector<float>& dw = buffers.dw;
  std::vector<float>& db = buffers.db;
  std::vector<float>& da = buffers.da;
  for (int64_t l = L - 1; l >= 0; --l) {
    const int64_t in = shape.In(l), out = shape.Out(l);
    ZEROD_RETURN_IF_ERROR(e.Gather(e.UnitOf(2 * l)));
    w.resize(static_cast<size_t>(in * out));
    ZEROD_RETURN_IF_ERROR(e.ParamToFloat(2 * l, w.data()));
    ZEROD_RETURN_IF_ERROR(e.Release(e.UnitOf(2 * l)));
    const std::vector<float>& a = acts[static_cast<size_t>(l)];
    dw.assign(static_cast<size_t>(in * out), 0.0f);
    db.assign(static_cast<size_t>(out), 0.0f);
    da.assign(static_cast<size_t>(n * in), 0.0f);
    for (int64_t s = 0; s < n; ++s) {
      const float* ds = &delta[s * out];
      for (int64_t j = 0; j < out; ++j) db[j] += ds[j];
      for (int64_t i = 0; i < in; ++i) {
        const float x = a[s * in + i];
        float* dwi = &dw[i * out];
        const float* wi = &w[i * out];
        float back = 0;
        for (int64_t j = 0; j < out; ++j) {
          dwi[j] += x * ds[j];
          back += wi[j] * ds[j];
        }
        da[s * in + i] = back;
      }
    }
    ZEROD_RETURN_IF_ERROR(AddGrad(e, 2 * l + 1, db, device_staging));
    ZEROD_RETURN_IF_ERROR(AddGrad(e, 2 * l, dw, device_staging));
    if (l > 0) {
      // Through tanh: d/dz tanh(z) = 1 - tanh(z)^2, and a = tanh(z).
      delta.assign(static_cast<size_t>(n * in), 0.0f);
      for (size_t k = 0; k < da.size(); ++k) delta[k] = da[k] * (1.0f - a[k] * a[k]);
    }
  }
  return loss;
}

}  // namespace zerod::examples
