// PlanInputs from the wire: bytes -> v1::PlanInputs, then what a rank does with them
// (rpc::PlanFromInputs) and what the daemon does with a join carrying the same layout and options
// (CheckJoinArgs with CheckPlanOptions, then BuildPlan). A plan the daemon builds must verify on
// every rank: BuildPlan's inputs recomputed by PlanFromInputs give the same digest.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "proto/plan_convert.h"
#include "runtime/plan/digest.h"
#include "server/join_admission.h"
#include "server/plan_builder.h"
#include "tests/fuzz/quiet_logs.h"
#include "zerod/v1/plan.pb.h"

namespace {

// Beyond these the planner's work grows with the input, not with what it parses: the fuzzer
// would spend its time in big loops instead of on new branches.
constexpr int kMaxTensors = 256;
constexpr int kMaxDims = 8;
constexpr int64_t kMaxWorldSize = 1024;

bool Bounded(const zerod::v1::PlanInputs& inputs) {
  if (inputs.tensors_size() > kMaxTensors || inputs.world_size() > kMaxWorldSize) return false;
  for (const auto& t : inputs.tensors()) {
    if (t.shape_size() > kMaxDims) return false;
  }
  return true;
}

void Inspect(const zerod::plan::ShardPlan& plan) {
  const int64_t ranks = plan.options().world_size;
  for (int64_t rank : {int64_t{0}, ranks - 1}) {
    (void)plan.OwnedRanges(rank);
    (void)plan.MemoryForRank(rank);
  }
  (void)plan.Allocations();
  (void)plan.CommPerStep();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zerod::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zerod::v1::PlanInputs inputs;
  if (!inputs.ParseFromArray(data, static_cast<int>(size)) || !Bounded(inputs)) return 0;

  auto received = zerod::rpc::PlanFromInputs(inputs);
  if (received.ok()) Inspect(*received);

  zerod::server::JoinArgs args;
  args.job_id = "fuzz";
  args.world_size = inputs.world_size();
  args.rank = 0;
  args.budget_bytes = inputs.budget_bytes();
  args.layout.assign(inputs.tensors().begin(), inputs.tensors().end());
  args.options = inputs.options();
  // The real digest, so that inputs go on to the planner instead of stopping at the digest check.
  args.layout_digest =
      zerod::plan::DigestHex(zerod::plan::LayoutDigest(zerod::rpc::FromProto(inputs.tensors())));
  if (!zerod::server::CheckJoinArgs(args).ok()) return 0;

  auto built = zerod::server::BuildPlan({.job_id = args.job_id,
                                         .layout = args.layout,
                                         .layout_digest = args.layout_digest,
                                         .options = args.options,
                                         .world_size = args.world_size,
                                         .generation = inputs.generation(),
                                         .budget_bytes = args.budget_bytes});
  if (!built.ok()) return 0;
  Inspect(*built->shard_plan);
  std::string wire;
  if (!built->inputs.SerializeToString(&wire)) std::abort();
  zerod::v1::PlanInputs on_rank;
  if (!on_rank.ParseFromString(wire)) std::abort();
  auto verified = zerod::rpc::PlanFromInputs(on_rank);
  if (!verified.ok()) {
    fprintf(stderr, "a plan the daemon built does not verify on a rank: %s\n",
            std::string(verified.status().message()).c_str());
    std::abort();
  }
  return 0;
}
