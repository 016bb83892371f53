#include "runtime/optim/adam.h"

#include <algorithm>
#include <cmath>

#include "runtime/common/cpu_features.h"

namespace zerod::optim {

AdamScalars MakeAdamScalars(const AdamConfig& c, int64_t step, float grad_multiplier) {
  const double t = static_cast<double>(step);
  AdamScalars k;
  k.beta1 = static_cast<float>(c.beta1);
  k.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  k.beta2 = static_cast<float>(c.beta2);
  k.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  k.step_size = static_cast<float>(c.lr / (1.0 - std::pow(c.beta1, t)));
  k.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(c.beta2, t)));
  k.eps = static_cast<float>(c.eps);
  k.weight_decay = c.decoupled_weight_decay ? 0.0f : static_cast<float>(c.weight_decay);
  k.decay_factor =
      c.decoupled_weight_decay ? static_cast<float>(1.0 - c.lr * c.weight_decay) : 1.0f;
  k.grad_multiplier = grad_multiplier;
  return k;
}

std::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

std::vector<Isa> AvailableIsas() {
  std::vector<Isa> isas = {Isa::kScalar};
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CpuHasF16c()) {
    isas.push_back(Isa::kAvx2);
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
    isas.push_back(Isa::kAvx512);
  }
#endif
  return isas;
}

Isa BestIsa() { return AvailableIsas().back(); }

namespace {

using Kernel = void (*)(const AdamShard&, const AdamScalars&, int64_t, int64_t);

Kernel KernelFor(Isa isa) {
  if (isa == Isa::kAvx2) return internal::AdamAvx2;
  if (isa == Isa::kAvx512) return internal::AdamAvx512;
  return internal::AdamScalar;
}

// Below this many elements a step runs on the caller's thread: waking the pool costs more.
constexpr int64_t kParallelNumel = int64_t{1} << 16;

}  // namespace

void AdamStep(const AdamShard& shard, const AdamScalars& scalars, Isa isa, ThreadPool* pool) {
  const Kernel kernel = KernelFor(isa);
  // Chunks are multiples of 64 elements, so every ISA sees the same element boundaries.
  auto run = [&](int64_t begin, int64_t end) { kernel(shard, scalars, begin, end); };
  if (pool == nullptr || shard.numel < kParallelNumel) {
    run(0, shard.numel);
  } else {
    pool->ParallelFor(shard.numel, 64, run);
  }
}

void AdamStep(const std::vector<AdamRun>& runs, Isa isa, ThreadPool* pool) {
  const Kernel kernel = KernelFor(isa);
  // The runs laid end to end: run r holds elements [start[r], start[r + 1]).
  std::vector<int64_t> start(runs.size() + 1, 0);
  for (size_t r = 0; r < runs.size(); ++r) start[r + 1] = start[r] + runs[r].shard.numel;
  const int64_t total = start.back();
  // Each element's result depends on nothing but its own inputs and its run's scalars, so how
  // the elements are cut between threads changes no bit.
  auto range = [&](int64_t begin, int64_t end) {
    size_t r =
        static_cast<size_t>(std::upper_bound(start.begin(), start.end(), begin) - start.begin()) -
        1;
    for (; r < runs.size() && start[r] < end; ++r) {
      const int64_t first = std::max(begin, start[r]) - start[r];
      const int64_t last = std::min(end, start[r + 1]) - start[r];
      if (first < last) kernel(runs[r].shard, runs[r].scalars, first, last);
    }
  };
  if (pool == nullptr || total < kParallelNumel) {
    range(0, total);
  } else {
    pool->ParallelFor(total, 64, range);
  }
}

}  // namespace zerod::optim
