#ifndef ZEROD_TESTS_RUNTIME_CHECKPOINT_ENGINE_WORLD_H_
#define ZEROD_TESTS_RUNTIME_CHECKPOINT_ENGINE_WORLD_H_

// Real engines for checkpoint tests: `world` ranks as threads, each with its own Gloo
// communicator over loopback and its own ZeroEngine, trained on data-dependent gradients; and a
// checkpoint saved from them through checkpoint_files.h alone (every rank's file in parallel,
// then rank 0's manifest), as save_protocol does it without the store and the coordinator.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/engine/zero_engine.h"

namespace zerod::checkpoint::testing {

// Tensors of several sizes, cut into several segments; 3 ranks divide none of them evenly.
std::vector<plan::TensorSpec> SmallLayout();
// Over 4 MiB per state section at world 1: rank files span several checksum blocks.
std::vector<plan::TensorSpec> LargeLayout();

class EngineWorld {
 public:
  // InitParameters on every rank; an error is a test failure (ok() false).
  EngineWorld(std::vector<plan::TensorSpec> layout, int stage, int64_t world, DType dtype);
  ~EngineWorld();

  bool ok() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }
  int64_t world() const { return static_cast<int64_t>(engines_.size()); }
  engine::ZeroEngine& engine(int64_t rank) { return *engines_[static_cast<size_t>(rank)]; }

  // Runs fn on every rank at once, each on its own thread; the first error, else OK.
  absl::Status OnEveryRank(const std::function<absl::Status(int64_t, engine::ZeroEngine&)>& fn);
  // `steps` training steps (forward through every unit, backward last tensor first, Step).
  absl::Status Train(int64_t steps);
  // One state tensor of the whole model, in model order, read from the ranks that hold it.
  absl::StatusOr<std::vector<float>> State(engine::StateTensor which);
  absl::StatusOr<std::vector<float>> FullMasterParameters();

  // Every rank writes its file into `dir` (created) with extra bytes "extra of rank R", then
  // rank 0 writes the manifest.
  absl::StatusOr<Manifest> Save(const std::string& dir);
  // Restore on every rank.
  absl::Status Restore(const std::string& dir);

 private:
  std::vector<plan::TensorSpec> layout_;
  std::vector<std::unique_ptr<comm::GlooCommunicator>> comms_;
  std::vector<std::unique_ptr<engine::ZeroEngine>> engines_;
  int64_t steps_ = 0;
  absl::Status status_;
};

std::string ExtraOf(int64_t rank);

}  // namespace zerod::checkpoint::testing

#endif  // ZEROD_TESTS_RUNTIME_CHECKPOINT_ENGINE_WORLD_H_
