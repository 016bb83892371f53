#include "runtime/optim/adam.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/common/half.h"

namespace zerod::optim {
namespace {

struct State {
  std::vector<float> param, m, v;
  std::vector<float> grad32;
  std::vector<uint16_t> grad16;
  std::vector<uint16_t> low;
};

State MakeState(int64_t n, DType grad_dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  State s;
  for (int64_t i = 0; i < n; ++i) {
    s.param.push_back(normal(rng));
    s.m.push_back(normal(rng) * 0.1f);
    s.v.push_back(std::fabs(normal(rng)) * 0.01f);
    const float g = normal(rng) * (i % 7 == 0 ? 1000.0f : 1.0f);
    s.grad32.push_back(g);
    s.grad16.push_back(grad_dtype == DType::kFloat16 ? FloatToFp16(g / 100.0f) : FloatToBf16(g));
  }
  s.low.assign(static_cast<size_t>(n), 0);
  return s;
}

AdamShard ShardOf(State& s, DType grad_dtype, DType low_dtype) {
  AdamShard shard;
  shard.param = s.param.data();
  shard.exp_avg = s.m.data();
  shard.exp_avg_sq = s.v.data();
  shard.grad_dtype = grad_dtype;
  shard.grad = grad_dtype == DType::kFloat32 ? static_cast<const void*>(s.grad32.data())
                                             : static_cast<const void*>(s.grad16.data());
  shard.low_precision = s.low.data();
  shard.low_precision_dtype = low_dtype;
  shard.numel = static_cast<int64_t>(s.param.size());
  return shard;
}

// Every ISA and every thread count give the scalar kernel's bits, for every gradient dtype,
// both low-precision outputs, Adam and AdamW, and sizes with vector tails.
TEST(Adam, EveryIsaAndThreadCountMatchesScalarBitwise) {
  ThreadPool pool(3);
  for (DType grad : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (DType low : {DType::kBFloat16, DType::kFloat16}) {
      for (bool adamw : {false, true}) {
        for (int64_t n : {int64_t{1}, int64_t{17}, int64_t{1000}, int64_t{70001}}) {
          AdamConfig config{1e-2, 0.9, 0.99, 1e-8, 0.01, adamw};
          State reference = MakeState(n, grad, 42);
          const AdamScalars k = MakeAdamScalars(config, 3, 0.5f);
          AdamStep(ShardOf(reference, grad, low), k, Isa::kScalar);
          for (Isa isa : AvailableIsas()) {
            for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
              State s = MakeState(n, grad, 42);
              AdamStep(ShardOf(s, grad, low), k, isa, p);
              ASSERT_EQ(s.param, reference.param) << IsaName(isa) << " n=" << n;
              ASSERT_EQ(s.m, reference.m);
              ASSERT_EQ(s.v, reference.v);
              ASSERT_EQ(s.low, reference.low);
            }
          }
        }
      }
    }
  }
}

// The scalar kernel against the formula evaluated in double: float rounding only.
TEST(Adam, ScalarKernelFollowsTheFormula) {
  AdamConfig config{1e-3, 0.9, 0.999, 1e-8, 0.0, false};
  State s = MakeState(256, DType::kFloat32, 7);
  const State before = s;
  AdamStep(ShardOf(s, DType::kFloat32, DType::kBFloat16), MakeAdamScalars(config, 1), Isa::kScalar);
  for (size_t i = 0; i < s.param.size(); ++i) {
    const double g = before.grad32[i];
    const double m = 0.9 * before.m[i] + 0.1 * g;
    const double v = 0.999 * before.v[i] + 0.001 * g * g;
    const double p = before.param[i] - (1e-3 / 0.1) * m / (std::sqrt(v) / std::sqrt(0.001) + 1e-8);
    EXPECT_NEAR(s.param[i], p, 1e-5 * std::max(1.0, std::fabs(p)));
    EXPECT_EQ(s.low[i], FloatToBf16(s.param[i]));
  }
}

TEST(Adam, GradMultiplierScalesTheGradient) {
  AdamConfig config;
  State a = MakeState(64, DType::kFloat32, 1), b = a;
  for (float& g : b.grad32) g *= 0.25f;
  AdamStep(ShardOf(a, DType::kFloat32, DType::kBFloat16), MakeAdamScalars(config, 1, 0.25f),
           BestIsa());
  AdamStep(ShardOf(b, DType::kFloat32, DType::kBFloat16), MakeAdamScalars(config, 1, 1.0f),
           BestIsa());
  EXPECT_EQ(a.param, b.param);
}

}  // namespace
}  // namespace zerod::optim
