// The manifest survives its JSON exactly, and a manifest that does not add up is refused naming
// the field or file at fault.

#include <functional>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/internal/manifest_checks.h"
#include "runtime/plan/digest.h"
#include "tests/runtime/checkpoint/engine_world.h"

namespace zerod::checkpoint {
namespace {

using ::testing::HasSubstr;

// Two ranks holding interleaved runs of a 10-element model.
Manifest TwoRankManifest() {
  Manifest m;
  m.job_id = "job";
  m.step = 7;
  m.counters = {5, 7, {1024.0, 3, 1}, {5, 4}};
  m.world_size = 2;
  m.stage = 2;
  m.param_dtype = DType::kFloat16;
  m.grad_dtype = DType::kFloat32;
  m.layout = {{"a", {2, 3}, DType::kFloat16, "u0"}, {"b", {4}, DType::kFloat16, ""}};
  m.layout_digest = plan::DigestHex(plan::LayoutDigest(m.layout));
  m.plan_digest = "0123456789abcdef";
  m.total_numel = 10;
  m.files = {{0, RankFileName(0), {{0, 3}, {6, 2}}, 5, 4, 64, 0xfedcba9876543210ull, {42}},
             {1, RankFileName(1), {{3, 3}, {8, 2}}, 5, 0, 60, 1, {2}}};
  constexpr char kUser[] = "binary \xff\x00 position";  // not UTF-8, and a NUL inside
  m.user = std::string(kUser, sizeof(kUser) - 1);
  m.created_unix_ms = 1764800000000;
  return m;
}

TEST(ManifestJson, EveryFieldSurvivesTheRoundTrip) {
  const Manifest m = TwoRankManifest();
  auto back = ManifestFromJson(ManifestToJson(m), "m.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ManifestToJson(*back), ManifestToJson(m));
  EXPECT_EQ(back->user, m.user) << "bytes JSON cannot hold travel as base64";
  EXPECT_EQ(back->files[0].xxh3, 0xfedcba9876543210ull);
  EXPECT_EQ(back->counters.loss_scaler.scale, 1024.0);
  EXPECT_EQ(back->param_dtype, DType::kFloat16);
  EXPECT_EQ(back->layout[0].unit, "u0");
  EXPECT_EQ(back->counters.tensor_steps, (std::vector<int64_t>{5, 4}));
}

// Checkpoints written before tensors had their own step counts have none: every tensor is then at
// applied_steps (the engine's restore reads an empty list so).
// Tensors' own step counts came after format 1: a format-1 manifest written before them (what
// `zeroctl checkpoint upgrade` reads) has no counters.tensor_steps, and reads as empty.
TEST(ManifestJson, AManifestWithoutTensorStepsReadsAsEmpty) {
  Manifest m = TwoRankManifest();
  m.format_version = 1;
  m.counters.tensor_steps.clear();
  std::string text = ManifestToJson(m);
  const std::string field = "\"tensor_steps\": []";
  ASSERT_NE(text.find(field), std::string::npos) << text;
  text.erase(text.find(field), field.size());
  // The comma before it now precedes a closing brace: take it out too.
  const size_t comma = text.rfind(',', text.find("}", text.find("\"counters\"")));
  text.erase(comma, 1);
  auto back = internal::LegacyManifestFromJson(text, "m.json");
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_TRUE(back->counters.tensor_steps.empty());
  EXPECT_EQ(back->counters.applied_steps, m.counters.applied_steps);
}

TEST(ManifestJson, RunsThatOverlapOrLeaveAGapAreRefused) {
  Manifest m = TwoRankManifest();
  m.files[1].runs = {{2, 4}, {8, 1}};
  m.files[1].numel = 5;
  auto overlap = ManifestFromJson(ManifestToJson(m), "m.json");
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(overlap.status().message()),
              HasSubstr("rank-00001.shard starts a run at element 2 where another file's run"));

  m = TwoRankManifest();
  m.files[1].runs = {{3, 3}, {9, 1}};
  m.files[1].numel = 4;
  m.files[1].bytes = 48;
  auto gap = ManifestFromJson(ManifestToJson(m), "m.json");
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(gap.status().message()), HasSubstr("elements from 8 are in no file"));
}

TEST(ManifestJson, SizesChecksumsAndDigestsThatDoNotAddUpAreRefused) {
  Manifest m = TwoRankManifest();
  m.files[0].bytes = 65;
  EXPECT_THAT(std::string(ManifestFromJson(ManifestToJson(m), "m.json").status().message()),
              HasSubstr("m.json: file rank-00000.shard: size 65 is not 12 x 5 elements + 4"));
  m = TwoRankManifest();
  m.files[0].block_xxh3.clear();
  EXPECT_THAT(std::string(ManifestFromJson(ManifestToJson(m), "m.json").status().message()),
              HasSubstr("0 block checksums for 1 blocks"));
  m = TwoRankManifest();
  m.layout[1].shape = {5};
  EXPECT_THAT(std::string(ManifestFromJson(ManifestToJson(m), "m.json").status().message()),
              HasSubstr("total_numel 10 differs from the layout's 11"));
  m = TwoRankManifest();
  m.layout_digest = "0000000000000000";
  EXPECT_THAT(std::string(ManifestFromJson(ManifestToJson(m), "m.json").status().message()),
              HasSubstr("layout_digest 0000000000000000 differs"));
  std::string text = ManifestToJson(TwoRankManifest());
  text.replace(text.find("\"format_version\": 2"), 19, "\"format_version\": 9");
  // Another format (a newer build's) is no damage: not DATA_LOSS, never set aside by a load.
  const absl::Status newer = ManifestFromJson(text, "m.json").status();
  EXPECT_EQ(newer.code(), absl::StatusCode::kFailedPrecondition) << newer;
  EXPECT_THAT(std::string(newer.message()), HasSubstr("format_version is 9; this build reads 2"));
}

// A restored run takes the counters as they are: a loss scale of 0 would zero every gradient.
TEST(ManifestJson, CountersARestoredRunCouldNotTrainOnAreRefused) {
  for (auto [field, bad] :
       std::vector<std::pair<std::string,
                             std::function<void(Manifest&)>>>{{"counters.loss_scale",
                                                               [](Manifest& m) {
                                                                 m.counters.loss_scaler.scale = 0;
                                                               }},
                                                              {"counters.hysteresis_left",
                                                               [](Manifest& m) {
                                                                 m.counters.loss_scaler
                                                                     .hysteresis_left = -1;
                                                               }},
                                                              {"counters.applied_steps",
                                                               [](Manifest& m) {
                                                                 m.counters.applied_steps = 8;
                                                               }},
                                                              {"'step'",
                                                               [](Manifest& m) { m.step = 6; }},
                                                              {"counters.tensor_steps",
                                                               [](Manifest& m) {
                                                                 m.counters.tensor_steps = {6, 1};
                                                               }},
                                                              {"counters.tensor_steps' has 1 "
                                                               "entries for 2 tensors",
                                                               [](Manifest& m) {
                                                                 m.counters.tensor_steps = {1};
                                                               }}}) {
    Manifest m = TwoRankManifest();
    bad(m);
    auto back = ManifestFromJson(ManifestToJson(m), "m.json");
    ASSERT_FALSE(back.ok()) << field;
    EXPECT_THAT(std::string(back.status().message()), HasSubstr(field));
  }
}

}  // namespace
}  // namespace zerod::checkpoint
