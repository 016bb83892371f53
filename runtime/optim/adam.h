#ifndef ZEROD_RUNTIME_OPTIM_ADAM_H_
#define ZEROD_RUNTIME_OPTIM_ADAM_H_

// Adam and AdamW on a rank's fp32 master shard, matching torch.optim.Adam/AdamW (foreach=False):
// the per-step scalars are formed in double and applied in float, in torch's order of operations.
//
// One pass over memory: reads the gradient (fp32, bf16 or fp16, times `grad_multiplier`, which
// carries loss-scale unscaling and gradient clipping), updates master, m and v in place, and
// writes the low-precision parameter copy when there is one. Vectorised with AVX2 or AVX-512
// (chosen at run time) and threaded; every ISA and every thread count gives the same bits.

#include <cstdint>
#include <string_view>
#include <vector>

#include "runtime/common/dtype.h"
#include "runtime/common/thread_pool.h"

namespace zerod::optim {

struct AdamConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // AdamW
};

// The step's scalars, computed once per step as torch computes them.
struct AdamScalars {
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float step_size;   // lr / (1 - beta1^t)
  float bias2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float weight_decay;  // Adam: added to the gradient (L2)
  float decay_factor;  // AdamW: 1 - lr * weight_decay; 1 otherwise
  float grad_multiplier;
};
AdamScalars MakeAdamScalars(const AdamConfig& config, int64_t step, float grad_multiplier = 1.0f);

// One contiguous shard. `param` is the fp32 master (or the fp32 parameters in fp32 training).
struct AdamShard {
  float* param = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  const void* grad = nullptr;
  DType grad_dtype = DType::kFloat32;
  void* low_precision = nullptr;  // optional bf16/fp16 copy of the updated parameters
  DType low_precision_dtype = DType::kBFloat16;
  int64_t numel = 0;
};

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
std::string_view IsaName(Isa isa);
// The ISAs this build has and this CPU runs, scalar first.
std::vector<Isa> AvailableIsas();
Isa BestIsa();

// Runs the step on `shard` with `isa` (must be available), on `pool`'s threads when given.
void AdamStep(const AdamShard& shard, const AdamScalars& scalars, Isa isa,
              ThreadPool* pool = nullptr);

// A shard and the scalars of its step. A step over parameter groups with their own
// hyperparameters, or over tensors at different step counts, is a list of runs: one per stretch
// of elements that share their scalars.
struct AdamRun {
  AdamShard shard;
  AdamScalars scalars;
};
// Runs the step on every run, as AdamStep on each would; the pool's threads share the runs'
// elements, so many small runs keep them as busy as one large run of the same size.
void AdamStep(const std::vector<AdamRun>& runs, Isa isa, ThreadPool* pool = nullptr);

namespace internal {
// Per-ISA kernels over elements [begin, end) of the shard.
void AdamScalar(const AdamShard& s, const AdamScalars& k, int64_t begin, int64_t end);
void AdamAvx2(const AdamShard& s, const AdamScalars& k, int64_t begin, int64_t end);
void AdamAvx512(const AdamShard& s, const AdamScalars& k, int64_t begin, int64_t end);
}  // namespace internal

}  // namespace zerod::optim

#endif  // ZEROD_RUNTIME_OPTIM_ADAM_H_
