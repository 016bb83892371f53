// Restore at any world size and stage: a checkpoint saved by 4 real ranks (threads over Gloo) at
// stages 0-3, in fp32 and bf16, loads at 4, 3, 2 and 1 ranks and at other stages with the fp32
// master, Adam m and v and the counters equal to the saving engines' bit for bit; and a restored
// world of the same shape takes the next step exactly as the saved one does.

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "tests/runtime/checkpoint/engine_world.h"
#include "tests/util/subprocess.h"

namespace zerod::checkpoint {
namespace {

using engine::StateTensor;
using testing::EngineWorld;

struct SavedState {
  std::vector<float> tensors[engine::kStateTensorCount];
  engine::TrainingCounters counters;
};

// What the saving engines hold, read from them (not from the files).
SavedState StateOf(EngineWorld& world) {
  SavedState s;
  for (int t = 0; t < engine::kStateTensorCount; ++t) {
    auto state = world.State(static_cast<StateTensor>(t));
    EXPECT_TRUE(state.ok()) << state.status();
    if (state.ok()) s.tensors[t] = *std::move(state);
  }
  s.counters = world.engine(0).counters();
  return s;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void ExpectSameCounters(const engine::TrainingCounters& a, const engine::TrainingCounters& b) {
  EXPECT_EQ(a.applied_steps, b.applied_steps);
  EXPECT_EQ(a.steps_taken, b.steps_taken);
  EXPECT_EQ(a.loss_scaler.scale, b.loss_scaler.scale);
  EXPECT_EQ(a.loss_scaler.clean_steps, b.loss_scaler.clean_steps);
  EXPECT_EQ(a.loss_scaler.hysteresis_left, b.loss_scaler.hysteresis_left);
  EXPECT_EQ(a.tensor_steps, b.tensor_steps);
}

void ExpectRestoredAsSaved(EngineWorld& loaded, const SavedState& saved) {
  const SavedState got = StateOf(loaded);
  for (int t = 0; t < engine::kStateTensorCount; ++t) {
    EXPECT_TRUE(BitEqual(got.tensors[t], saved.tensors[t])) << "state tensor " << t;
  }
  for (int64_t r = 0; r < loaded.world(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ExpectSameCounters(loaded.engine(r).counters(), saved.counters);
  }
}

TEST(Restore, AnyWorldSizeAndStageLoadsTheSavedStateBitForBit) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int save_stage = 0; save_stage <= 3; ++save_stage) {
      SCOPED_TRACE(absl::StrCat("saved at stage ", save_stage, " ", DTypeName(dtype)));
      zerod::testing::TempDir tmp;
      const std::string dir = StepDirectory(tmp.path(), 3);
      EngineWorld saver(testing::SmallLayout(), save_stage, 4, dtype);
      ASSERT_TRUE(saver.ok()) << saver.status();
      ASSERT_TRUE(saver.Train(3).ok());
      const SavedState saved = StateOf(saver);
      ASSERT_EQ(saved.counters.applied_steps, 3);
      ASSERT_EQ(saved.counters.tensor_steps[0], 2) << "tensor 0 has no gradient at step 1";
      // Non-trivial state: Adam's moments moved away from zero everywhere.
      for (float v : saved.tensors[static_cast<int>(StateTensor::kAdamV)]) ASSERT_GT(v, 0.0f);

      auto manifest = saver.Save(dir);
      ASSERT_TRUE(manifest.ok()) << manifest.status();
      ASSERT_TRUE(Verify(dir).ok()) << Verify(dir);

      for (int64_t world : {4, 3, 2, 1}) {
        // Every pair of stages is met across the four saves.
        for (int load_stage : {save_stage, (save_stage + static_cast<int>(world)) % 4}) {
          SCOPED_TRACE(absl::StrCat("loaded at world ", world, " stage ", load_stage));
          EngineWorld loaded(testing::SmallLayout(), load_stage, world, dtype);
          ASSERT_TRUE(loaded.ok()) << loaded.status();
          ASSERT_TRUE(loaded.Restore(dir).ok()) << loaded.Restore(dir);
          ExpectRestoredAsSaved(loaded, saved);
          for (int64_t r = 0; r < world; ++r) {
            auto extra = ReadExtra(dir, *manifest, r);
            ASSERT_TRUE(extra.ok()) << extra.status();
            EXPECT_EQ(*extra, testing::ExtraOf(r));
          }
        }
      }

      // The same world and stage continues exactly as the saved one: one more step on each.
      EngineWorld resumed(testing::SmallLayout(), save_stage, 4, dtype);
      ASSERT_TRUE(resumed.Restore(dir).ok());
      ASSERT_TRUE(saver.Train(1).ok());
      ASSERT_TRUE(resumed.Train(1).ok());
      auto want = saver.FullMasterParameters();
      auto got = resumed.FullMasterParameters();
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_TRUE(BitEqual(*got, *want)) << "the next step differs after a restore";
      ExpectRestoredAsSaved(resumed, StateOf(saver));
    }
  }
}

TEST(Restore, FloatSixteenContinuesWithTheSavedLossScale) {
  zerod::testing::TempDir tmp;
  const std::string dir = StepDirectory(tmp.path(), 3);
  EngineWorld saver(testing::SmallLayout(), 2, 2, DType::kFloat16);
  ASSERT_TRUE(saver.ok()) << saver.status();
  ASSERT_TRUE(saver.Train(3).ok());
  const SavedState saved = StateOf(saver);
  ASSERT_EQ(saved.counters.loss_scaler.scale, 2048.0) << "grown once from 1024";
  ASSERT_EQ(saved.counters.loss_scaler.clean_steps, 1);
  ASSERT_TRUE(saver.Save(dir).ok());

  EngineWorld resumed(testing::SmallLayout(), 2, 2, DType::kFloat16);
  ASSERT_TRUE(resumed.Restore(dir).ok()) << resumed.Restore(dir);
  ExpectRestoredAsSaved(resumed, saved);
  EXPECT_EQ(resumed.engine(1).loss_scale(), 2048.0);
  // The next step grows the scale again on both, as one uninterrupted run would.
  ASSERT_TRUE(saver.Train(1).ok());
  ASSERT_TRUE(resumed.Train(1).ok());
  EXPECT_EQ(resumed.engine(0).loss_scale(), 4096.0);
  auto want = saver.FullMasterParameters();
  auto got = resumed.FullMasterParameters();
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_TRUE(BitEqual(*got, *want));
}

TEST(Restore, FilesLargerThanAChecksumBlockLoadAtAnotherWorldSize) {
  zerod::testing::TempDir tmp;
  const std::string dir = StepDirectory(tmp.path(), 1);
  EngineWorld saver(testing::LargeLayout(), 2, 4, DType::kBFloat16);
  ASSERT_TRUE(saver.ok()) << saver.status();
  ASSERT_TRUE(saver.Train(1).ok());
  const SavedState saved = StateOf(saver);
  auto manifest = saver.Save(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  ASSERT_GT(manifest->files[0].block_xxh3.size(), 1u) << "the test needs several blocks per file";
  ASSERT_TRUE(Verify(dir).ok()) << Verify(dir);
  for (auto [world, stage] : {std::pair<int64_t, int>{3, 3}, {1, 0}}) {
    SCOPED_TRACE(absl::StrCat("world ", world, " stage ", stage));
    EngineWorld loaded(testing::LargeLayout(), stage, world, DType::kBFloat16);
    ASSERT_TRUE(loaded.Restore(dir).ok()) << loaded.Restore(dir);
    ExpectRestoredAsSaved(loaded, saved);
  }
}

TEST(Restore, AModelOfAnotherLayoutIsRefusedNamingTheTensor) {
  zerod::testing::TempDir tmp;
  const std::string dir = StepDirectory(tmp.path(), 0);
  EngineWorld saver(testing::SmallLayout(), 1, 2, DType::kFloat32);
  ASSERT_TRUE(saver.Save(dir).ok());
  auto manifest = ReadManifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();

  std::vector<plan::TensorSpec> other = testing::SmallLayout();
  other[3].shape = {13, 7};  // w1 transposed
  EngineWorld loader(other, 1, 1, DType::kFloat32);
  absl::Status s = Restore(dir, *manifest, loader.engine(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()),
              ::testing::AllOf(::testing::HasSubstr(dir), ::testing::HasSubstr("'w1' [7, 13]"),
                               ::testing::HasSubstr("'w1' [13, 7]")));

  other = testing::SmallLayout();
  other.pop_back();
  EngineWorld shorter(other, 0, 1, DType::kFloat32);
  s = Restore(dir, *manifest, shorter.engine(0));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("tensor 'w2' is only there"));
}

}  // namespace
}  // namespace zerod::checkpoint
