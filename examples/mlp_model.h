#ifndef ZEROD_EXAMPLES_MLP_MODEL_H_
#define ZEROD_EXAMPLES_MLP_MODEL_H_

// A small multi-layer perceptron with forward and backward written out, trained on synthetic
// data: inputs from a seed, targets from a fixed random "teacher" network of the same shape.
// Each layer (weight and bias) is one stage-3 gather unit.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/engine/zero_engine.h"
#include "runtime/plan/plan_input.h"

namespace zerod::examples {

struct MlpShape {
  int64_t inputs = 32;
  int64_t hidden = 64;
  int64_t layers = 4;  // hidden layers + the output layer
  int64_t outputs = 8;

  int64_t In(int64_t layer) const { return layer == 0 ? inputs : hidden; }
  int64_t Out(int64_t layer) const { return layer == layers - 1 ? outputs : hidden; }
};

// Tensors "layer<l>.weight" [in, out] and "layer<l>.bias" [out], unit "layer<l>".
std::vector<plan::TensorSpec> MlpLayout(const MlpShape& shape, DType dtype);
// Deterministic initial value of element i of tensor t (scaled like Xavier).
void MlpInit(const MlpShape& shape, uint64_t seed, int64_t tensor, float* out);

struct Batch {
  int64_t size = 0;
  std::vector<float> x;  // size x inputs
  std::vector<float> t;  // size x outputs
};

// The synthetic data set: inputs drawn per (seed, step, sample), targets from a fixed random
// teacher network of the same shape (its weights drawn once).
class Dataset {
 public:
  Dataset(const MlpShape& shape, uint64_t seed);
  // Samples [first, first + count) of step `step`'s global batch.
  Batch Make(int64_t step, int64_t first, int64_t count) const;

 private:
  void Teacher(const float* x, float* y) const;

  MlpShape shape_;
  uint64_t seed_;
  std::vector<std::vector<float>> weights_, biases_;
};

// The host buffers of a micro-step (activations, weights, gradients), kept from one to the next
// as a framework's caching allocator keeps them: allocated afresh, their megabytes went back to
// the kernel and were faulted in and zeroed again every micro-step, more or less often with the
// stage (glibc's trim threshold follows the largest block freed), which train_step_bench then
// counted as the stage's cost.
struct MicroStepBuffers {
  std::vector<std::vector<float>> acts;
  std::vector<float> w, b, delta, dw, db, da;
};

// One micro-step on `engine`: forward (gathering each unit), mean-squared-error loss over the
// batch, backward (gradients times the engine's loss scale). Returns the batch's loss. The model
// computes on the host in `buffers`; with the engine on a GPU, gradients are uploaded through
// `device_staging`, an fp32 buffer in the engine's memory as large as the largest tensor.
absl::StatusOr<double> TrainMicroStep(const MlpShape& shape, engine::ZeroEngine& engine,
                                      const Batch& batch, MicroStepBuffers& buffers,
                                      engine::Buffer* device_staging = nullptr);

}  // namespace zerod::examples

#endif  // ZEROD_EXAMPLES_MLP_MODEL_H_
