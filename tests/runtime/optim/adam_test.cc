#include "runtime/optim/adam.h"

#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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

// `low` empty: no low-precision copy.
AdamShard ShardOf(State& s, DType grad_dtype, std::optional<DType> low) {
  AdamShard shard;
  shard.param = s.param.data();
  shard.exp_avg = s.m.data();
  shard.exp_avg_sq = s.v.data();
  shard.grad_dtype = grad_dtype;
  shard.grad = grad_dtype == DType::kFloat32 ? static_cast<const void*>(s.grad32.data())
                                             : static_cast<const void*>(s.grad16.data());
  if (low) {
    shard.low_precision = s.low.data();
    shard.low_precision_dtype = *low;
  }
  shard.numel = static_cast<int64_t>(s.param.size());
  return shard;
}

const std::optional<DType> kCopies[] = {std::nullopt, DType::kBFloat16, DType::kFloat16};

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float f : values) bits.push_back(FloatBits(f));
  return bits;
}

// Runs `k` on a copy of `input` with every ISA and thread count, and expects the scalar kernel's
// bits (compared as bits, so that NaN equals NaN).
void ExpectEveryIsaMatchesScalar(const State& input, DType grad, std::optional<DType> low,
                                 const AdamScalars& k, const std::string& what) {
  ThreadPool pool(3);
  State reference = input;
  AdamStep(ShardOf(reference, grad, low), k, Isa::kScalar);
  for (Isa isa : AvailableIsas()) {
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      State s = input;
      AdamStep(ShardOf(s, grad, low), k, isa, p);
      const std::string where = absl::StrCat(
          what, " isa=", std::string(IsaName(isa)), " grad=", DTypeName(grad),
          " copy=", low ? DTypeName(*low) : "none", " n=", input.param.size(), p ? " pooled" : "");
      ASSERT_EQ(Bits(s.param), Bits(reference.param)) << where;
      ASSERT_EQ(Bits(s.m), Bits(reference.m)) << where;
      ASSERT_EQ(Bits(s.v), Bits(reference.v)) << where;
      ASSERT_EQ(s.low, reference.low) << where;
    }
  }
}

// Every ISA and every thread count give the scalar kernel's bits, for every gradient dtype, with
// and without each low-precision copy, Adam and AdamW, every size up to 65 (one more than two
// AVX-512 iterations: every tail length of every kernel) and two larger ones, threaded in chunks.
TEST(Adam, EveryIsaAndThreadCountMatchesScalarBitwise) {
  std::vector<int64_t> sizes = {1000, 70001};
  for (int64_t n = 1; n <= 65; ++n) sizes.push_back(n);
  for (DType grad : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (std::optional<DType> low : kCopies) {
      for (bool adamw : {false, true}) {
        for (int64_t n : sizes) {
          const AdamConfig config{1e-2, 0.9, 0.99, 1e-8, 0.01, adamw};
          ExpectEveryIsaMatchesScalar(MakeState(n, grad, 42), grad, low,
                                      MakeAdamScalars(config, 3, 0.5f), adamw ? "adamw" : "adam");
        }
      }
    }
  }
}

// A step over runs with their own scalars (parameter groups, tensors at other step counts) gives,
// for every ISA and thread count, the bits of the scalar kernel run on each run alone: runs of
// every length up to 70 and two larger ones, starting at every alignment, threads cutting across
// run boundaries.
TEST(Adam, RunsWithTheirOwnScalarsMatchEachRunSteppedAlone) {
  std::vector<int64_t> lengths;
  for (int64_t n = 1; n <= 70; ++n) lengths.push_back(n);
  lengths.push_back(40000);
  lengths.push_back(33333);
  int64_t total = 0;
  for (int64_t n : lengths) total += n;
  const AdamScalars groups[] = {
      MakeAdamScalars({1e-2, 0.9, 0.99, 1e-8, 0.1, true}, 3, 0.5f),
      MakeAdamScalars({3e-2, 0.8, 0.95, 1e-6, 0.0, true}, 3, 0.5f),
      MakeAdamScalars({1e-2, 0.9, 0.99, 1e-8, 0.1, true}, 1, 0.5f),  // a tensor stepped less
      MakeAdamScalars({1e-3, 0.9, 0.999, 1e-8, 0.01, false}, 7, 0.5f)};
  for (DType grad : {DType::kFloat32, DType::kBFloat16}) {
    for (std::optional<DType> low : {std::optional<DType>(), std::optional<DType>(grad)}) {
      const State input = MakeState(total, grad, 11);
      // Run r: the next lengths[r] elements, with groups[r % 4].
      auto runs_of = [&](State& s) {
        const AdamShard whole = ShardOf(s, grad, low);
        const int64_t bytes = DTypeBytes(grad);
        std::vector<AdamRun> runs;
        int64_t at = 0;
        for (size_t r = 0; r < lengths.size(); ++r) {
          AdamShard part = whole;
          part.param += at;
          part.exp_avg += at;
          part.exp_avg_sq += at;
          part.grad = static_cast<const char*>(whole.grad) + at * bytes;
          if (low) part.low_precision = static_cast<uint16_t*>(whole.low_precision) + at;
          part.numel = lengths[r];
          runs.push_back({part, groups[r % 4]});
          at += lengths[r];
        }
        return runs;
      };
      State reference = input;
      for (const AdamRun& run : runs_of(reference)) AdamStep(run.shard, run.scalars, Isa::kScalar);
      ThreadPool pool(3);
      for (Isa isa : AvailableIsas()) {
        for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
          State s = input;
          AdamStep(runs_of(s), isa, p);
          const std::string where = absl::StrCat("isa=", std::string(IsaName(isa)),
                                                 " grad=", DTypeName(grad), p ? " pooled" : "");
          ASSERT_EQ(Bits(s.param), Bits(reference.param)) << where;
          ASSERT_EQ(Bits(s.m), Bits(reference.m)) << where;
          ASSERT_EQ(Bits(s.v), Bits(reference.v)) << where;
          ASSERT_EQ(s.low, reference.low) << where;
        }
      }
    }
  }
}

// Float patterns where a conversion to bf16 or fp16 can slip: ties that round to even (down and
// up), one unit either side, the largest finite values and those that round to infinity,
// subnormals of both formats and of fp32, zeros and infinities.
std::vector<uint32_t> RoundingBoundaries() {
  const uint32_t centres[] = {
      // bf16: ties at 1.0 (even, stays) and 1.0078125 (odd, rounds up); the top of the range.
      0x3f808000, 0x3f818000, 0x3f80ffff, 0x7f7f7fff, 0x7f7f8000, 0x7f7fffff,
      // bf16 of fp32 subnormals: a tie, an odd tie, the smallest, the largest, one rounding up to
      // the smallest normal.
      0x00008000, 0x00018000, 0x00000001, 0x007fffff, 0x007f8000,
      // fp16: 65504, the tie above it (rounds to infinity), ties at 1 + 2^-11 and 1 + 3 * 2^-11.
      0x477fe000, 0x477ff000, 0x3f801000, 0x3f803000,
      // fp16 subnormals: half the smallest (rounds to zero, even), the smallest, ties at 1.5 and
      // 2.5 times it, the largest, the smallest normal.
      0x33000000, 0x33800000, 0x33c00000, 0x34200000, 0x387fc000, 0x38800000,
      // Zero and infinity.
      0x00000000, 0x7f800000};
  std::vector<uint32_t> out;
  for (uint32_t c : centres) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      for (uint32_t u : {c - 1, c, c + 1}) {
        if ((u & 0x7fffffffu) <= 0x7f800000u) out.push_back(sign | u);  // no NaN here
      }
    }
  }
  return out;
}

// A random NaN: quiet or signalling, either sign, any payload.
uint32_t RandomNan32(std::mt19937_64& rng) {
  const uint32_t payload = static_cast<uint32_t>(rng()) & 0x7fffffu;
  return (static_cast<uint32_t>(rng()) & 0x80000000u) | 0x7f800000u | (payload ? payload : 1u);
}
uint16_t RandomNan16(std::mt19937_64& rng, DType dtype) {
  const uint16_t bits = static_cast<uint16_t>(rng());
  if (dtype == DType::kBFloat16) {
    return static_cast<uint16_t>((bits & 0x807fu) | 0x7f80u | ((bits & 0x7fu) ? 0u : 1u));
  }
  return static_cast<uint16_t>((bits & 0x83ffu) | 0x7c00u | ((bits & 0x3ffu) ? 0u : 1u));
}

// With lr 0 the step leaves each finite parameter as it was, so the copy is the conversion of the
// chosen patterns themselves: every boundary, NaNs with their payloads, and random patterns, at
// every lane position (the list's length is odd) and in the scalar tail.
TEST(Adam, EveryIsaRoundsTheCopyLikeScalarAtBoundariesNanAndSubnormals) {
  std::mt19937_64 rng(5);
  std::vector<uint32_t> patterns = RoundingBoundaries();
  if (patterns.size() % 2 == 0) patterns.push_back(0x3f800000);
  for (int i = 0; i < 64; ++i) patterns.push_back(RandomNan32(rng));
  for (int i = 0; i < 256; ++i) patterns.push_back(static_cast<uint32_t>(rng()));
  for (DType grad : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (std::optional<DType> low :
         {std::optional<DType>(DType::kBFloat16), std::optional<DType>(DType::kFloat16)}) {
      const int64_t n = 4 * static_cast<int64_t>(patterns.size()) + 13;
      State s = MakeState(n, grad, 9);
      for (int64_t i = 0; i < n; ++i) s.param[i] = BitsFloat(patterns[i % patterns.size()]);
      const AdamConfig config{0.0, 0.9, 0.999, 1e-8, 0.0, false};
      const AdamScalars k = MakeAdamScalars(config, 1);
      ExpectEveryIsaMatchesScalar(s, grad, low, k, "boundaries");
      // The patterns reached the conversion: lr 0 kept every finite nonzero one (a zero may
      // change sign), and the copy is the conversion of the updated parameter.
      State scalar = s;
      AdamStep(ShardOf(scalar, grad, low), k, Isa::kScalar);
      for (int64_t i = 0; i < n; ++i) {
        const float p = scalar.param[i];
        ASSERT_EQ(scalar.low[i], *low == DType::kFloat16 ? FloatToFp16(p) : FloatToBf16(p)) << i;
        if (std::isfinite(s.param[i]) && s.param[i] != 0) {
          ASSERT_EQ(FloatBits(p), FloatBits(s.param[i])) << i;
        }
      }
    }
  }
}

// Special inputs through the whole step: infinities, zeros, subnormals, negative second moments
// and random patterns in every input, and NaNs with their payloads in one input at a time (so that
// no operation meets two different NaNs, whose order of operands would choose the result).
TEST(Adam, EveryIsaMatchesScalarOnNanInfinityAndSubnormalInputs) {
  const std::vector<uint32_t> boundaries = RoundingBoundaries();
  for (DType grad : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (std::optional<DType> low : kCopies) {
      std::mt19937_64 rng(11);
      auto special32 = [&]() -> float {
        uint32_t u =
            rng() % 2 ? boundaries[rng() % boundaries.size()] : static_cast<uint32_t>(rng());
        if ((u & 0x7fffffffu) > 0x7f800000u) u = 0x7f800000u;  // NaNs only where chosen below
        return BitsFloat(u);
      };
      auto special16 = [&]() -> uint16_t {
        const float f = special32();
        return grad == DType::kFloat16 ? FloatToFp16(f) : FloatToBf16(f);
      };
      const int64_t n = 2011;
      State s = MakeState(n, grad, 3);
      for (int64_t i = 0; i < n; ++i) {
        switch (rng() % 6) {
          case 0:  // a NaN gradient
            s.grad32[i] = BitsFloat(RandomNan32(rng));
            s.grad16[i] = RandomNan16(rng, grad);
            break;
          case 1:  // a NaN parameter
            s.param[i] = BitsFloat(RandomNan32(rng));
            break;
          case 2:  // a NaN moment
            (rng() % 2 ? s.m[i] : s.v[i]) = BitsFloat(RandomNan32(rng));
            break;
          default:  // no NaN: special values anywhere
            s.param[i] = special32();
            s.m[i] = special32();
            s.v[i] = special32();
            s.grad32[i] = special32();
            s.grad16[i] = special16();
        }
      }
      for (bool adamw : {false, true}) {
        const AdamConfig config{1e-2, 0.9, 0.999, 1e-8, 0.01, adamw};
        ExpectEveryIsaMatchesScalar(s, grad, low, MakeAdamScalars(config, 2, 0.125f),
                                    adamw ? "special adamw" : "special adam");
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
