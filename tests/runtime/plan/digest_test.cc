// Layout and plan digests: the coordinator and every rank compare them across machines, so they
// are pinned to fixed values here, and every input that shapes a plan must move them.

#include "runtime/plan/digest.h"

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/plan/shard_plan.h"

namespace zerod::plan {
namespace {

std::vector<TensorSpec> Layout() {
  return {{"wte", {50, 8}, DType::kBFloat16, "embed"},
          {"h0.w", {8, 24}, DType::kBFloat16, "h0"},
          {"h0.b", {24}, DType::kFloat32, "h0"},
          {"ln_f", {}, DType::kFloat16, ""}};
}

PlanOptions Options() {
  PlanOptions o;
  o.world_size = 4;
  o.stage = 2;
  return o;
}

TEST(Digest, PinnedValues) {
  // Stored jobs and ranks of other builds compare against these: a format change must be
  // deliberate (bump the "v1" tags in digest.cc) and re-pinned here.
  EXPECT_EQ(DigestHex(LayoutDigest(Layout())), "6f3665a0086c59ae");
  EXPECT_EQ(DigestHex(PlanDigest(Layout(), Options(), 2)), "bb6d79346bdaf093");
  // This one was also computed outside digest.cc, by XXH3 over the bytes the header describes
  // (little-endian int64s, length-prefixed strings).
  EXPECT_EQ(DigestHex(PlanDigest({{"x", {1}, DType::kFloat32, ""}}, PlanOptions{}, 0)),
            "2567bfd67fa9f77e");
}

TEST(Digest, HexIsSixteenLowerCaseDigits) {
  EXPECT_EQ(DigestHex(0), "0000000000000000");
  EXPECT_EQ(DigestHex(0x1f), "000000000000001f");
  EXPECT_EQ(DigestHex(0xfedcba9876543210ull), "fedcba9876543210");
}

TEST(Digest, IndependentOfCallOrder) {
  const uint64_t first = PlanDigest(Layout(), Options(), 2);
  std::vector<TensorSpec> other = Layout();
  other[0].name = "other";
  (void)PlanDigest(other, Options(), 3);
  (void)LayoutDigest(other);
  EXPECT_EQ(PlanDigest(Layout(), Options(), 2), first);
}

// Each change to the layout, named; every one must give a digest of its own.
std::vector<std::pair<std::string, std::vector<TensorSpec>>> LayoutChanges() {
  std::vector<std::pair<std::string, std::vector<TensorSpec>>> out;
  auto change = [&](std::string what, const std::function<void(std::vector<TensorSpec>&)>& f) {
    std::vector<TensorSpec> t = Layout();
    f(t);
    out.emplace_back(std::move(what), std::move(t));
  };
  change("name", [](auto& t) { t[1].name = "h0.v"; });
  change("a dimension", [](auto& t) { t[1].shape[1] = 25; });
  change("shape, same numel", [](auto& t) { t[1].shape = {24, 8}; });
  change("rank, same numel", [](auto& t) { t[1].shape = {192}; });
  change("scalar to [1]", [](auto& t) { t[3].shape = {1}; });
  change("dtype", [](auto& t) { t[2].dtype = DType::kBFloat16; });
  change("order", [](auto& t) { std::swap(t[1], t[2]); });
  change("a tensor fewer", [](auto& t) { t.pop_back(); });
  change("a tensor more", [](auto& t) { t.push_back({"extra", {1}, DType::kFloat32, ""}); });
  // Length prefixes keep the boundary between two names part of the digest.
  change("name boundary", [](auto& t) {
    t[1].name = "h0.wh";
    t[2].name = "0.b";
  });
  return out;
}

TEST(Digest, LayoutDigestSeesEveryLayoutFieldButNotUnits) {
  const uint64_t base = LayoutDigest(Layout());
  std::vector<uint64_t> seen = {base};
  for (const auto& [what, tensors] : LayoutChanges()) {
    const uint64_t d = LayoutDigest(tensors);
    for (uint64_t s : seen) EXPECT_NE(d, s) << what;
    seen.push_back(d);
  }
  std::vector<TensorSpec> relabelled = Layout();
  relabelled[1].unit = "block0";
  relabelled[3].unit = "tail";
  EXPECT_EQ(LayoutDigest(relabelled), base) << "unit labels are plan options, not layout";
}

TEST(Digest, PlanDigestSeesTheLayoutAndItsUnits) {
  const uint64_t base = PlanDigest(Layout(), Options(), 2);
  std::vector<uint64_t> seen = {base};
  auto layouts = LayoutChanges();
  std::vector<TensorSpec> relabelled = Layout();
  relabelled[1].unit = "block0";
  layouts.emplace_back("unit label", relabelled);
  for (const auto& [what, tensors] : layouts) {
    const uint64_t d = PlanDigest(tensors, Options(), 2);
    for (uint64_t s : seen) EXPECT_NE(d, s) << what;
    seen.push_back(d);
  }
}

TEST(Digest, PlanDigestSeesEveryOptionThatShapesThePlan) {
  const uint64_t base = PlanDigest(Layout(), Options(), 2);
  std::vector<std::pair<std::string, std::function<void(PlanOptions&)>>> changes = {
      {"world_size", [](PlanOptions& o) { o.world_size = 8; }},
      {"param_dtype", [](PlanOptions& o) { o.param_dtype = DType::kFloat16; }},
      {"grad_dtype", [](PlanOptions& o) { o.grad_dtype = DType::kFloat32; }},
      {"optimizer", [](PlanOptions& o) { o.optimizer = Optimizer::kAdamW; }},
      {"partition_alignment_numel", [](PlanOptions& o) { o.partition_alignment_numel = 32; }},
      {"reduce_bucket_bytes", [](PlanOptions& o) { o.reduce_bucket_bytes = 1 << 20; }},
      {"bucket_buffers", [](PlanOptions& o) { o.bucket_buffers = 3; }},
      {"gather_unit_bytes", [](PlanOptions& o) { o.gather_unit_bytes = 1 << 20; }},
      {"prefetch_depth", [](PlanOptions& o) { o.prefetch_depth = 2; }},
      {"max_live_units", [](PlanOptions& o) { o.max_live_units = 3; }},
  };
  std::vector<uint64_t> seen = {base};
  for (const auto& [what, change] : changes) {
    PlanOptions o = Options();
    change(o);
    const uint64_t d = PlanDigest(Layout(), o, 2);
    for (uint64_t s : seen) EXPECT_NE(d, s) << what;
    seen.push_back(d);
  }
  for (int stage : {0, 1, 3}) {
    const uint64_t d = PlanDigest(Layout(), Options(), stage);
    for (uint64_t s : seen) EXPECT_NE(d, s) << "stage " << stage;
    seen.push_back(d);
  }
}

TEST(Digest, TheBudgetAndTheRequestedStageDoNotCount) {
  const uint64_t base = PlanDigest(Layout(), Options(), 2);
  PlanOptions o = Options();
  o.budget_bytes = int64_t{1} << 30;
  EXPECT_EQ(PlanDigest(Layout(), o, 2), base) << "ranks may join with different budgets";
  o.stage = kAutoStage;
  EXPECT_EQ(PlanDigest(Layout(), o, 2), base) << "only the resolved stage counts";
}

TEST(Digest, APlanCarriesTheDigestOfItsResolvedStage) {
  PlanInput in{Layout(), Options()};
  in.options.stage = kAutoStage;  // no budget: stage 0
  auto automatic = ShardPlan::Create(in);
  ASSERT_TRUE(automatic.ok()) << automatic.status();
  ASSERT_EQ(automatic->stage(), 0);
  in.options.stage = 0;
  auto fixed = ShardPlan::Create(in);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  EXPECT_EQ(automatic->digest(), fixed->digest());
  EXPECT_EQ(fixed->digest(), PlanDigest(Layout(), in.options, 0));
  EXPECT_EQ(fixed->DigestHex(), DigestHex(fixed->digest()));
}

}  // namespace
}  // namespace zerod::plan
