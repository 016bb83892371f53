// plan_bench: how long planning a 1T-parameter model in 10,000 tensors over 4,096 ranks takes,
// and the peak memory it needs. Beside it, the floor measured in the same run: one pass that only
// reads the layout (its digest), which any planner must at least do.
//
//   build/bin/plan_bench [--params 1e12] [--tensors 10000] [--ranks 4096] [--repeat 20]

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/plan/digest.h"
#include "runtime/plan/shard_plan.h"
#include "runtime/plan/synthetic_layout.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double MedianMs(int repeat, F&& f) {
  std::vector<double> ms;
  for (int i = 0; i < repeat; ++i) {
    const auto start = Clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

long PeakRssKib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

}  // namespace

int main(int argc, char** argv) {
  double params = 1e12;
  long tensors = 10000, ranks = 4096, repeat = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--params"))
      params = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--tensors"))
      tensors = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--ranks"))
      ranks = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeat"))
      repeat = std::atol(argv[i + 1]);
    else {
      std::fprintf(stderr, "plan_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  using namespace zerod;
  const long rss_before = PeakRssKib();
  const std::vector<plan::TensorSpec> layout =
      plan::SyntheticLayout(static_cast<int64_t>(params), DType::kBFloat16, tensors);

  plan::PlanInput input;
  input.tensors = layout;
  input.options.world_size = ranks;

  uint64_t sink = 0;
  const double floor_ms = MedianMs(repeat, [&] { sink ^= plan::LayoutDigest(layout); });

  auto plan_once = [&](int stage, std::optional<int64_t> budget) {
    plan::PlanInput in = input;
    in.options.stage = stage;
    in.options.budget_bytes = budget;
    auto p = plan::ShardPlan::Create(std::move(in));
    if (!p.ok()) {
      std::fprintf(stderr, "plan_bench: %s\n", std::string(p.status().message()).c_str());
      std::exit(1);
    }
    // What a caller asks next: rank 0's memory, the communication, and one tensor's pieces.
    sink ^= static_cast<uint64_t>(p->MemoryForRank(0).Total() + p->CommPerStep().Total());
    sink ^= p->Pieces(static_cast<int64_t>(layout.size()) / 2).size();
    return p->stage();
  };
  const double stage3_ms = MedianMs(repeat, [&] { plan_once(3, std::nullopt); });
  // 'auto' with a budget that only stage 3 meets builds all four stages.
  plan::PlanInput probe = input;
  probe.options.stage = 3;
  const int64_t stage3_bytes = plan::ShardPlan::Create(probe)->AllocatedBytesPerRank();
  int chosen = -1;
  const double auto_ms =
      MedianMs(repeat, [&] { chosen = plan_once(plan::kAutoStage, stage3_bytes); });
  const long rss_after = PeakRssKib();

  std::printf("plan_bench: %.3g params in %ld tensors over %ld ranks (median of %ld runs)\n",
              params, tensors, ranks, repeat);
  std::printf("  floor: read the layout once (digest)   %8.3f ms\n", floor_ms);
  std::printf("  plan stage 3 + memory + comm + pieces  %8.3f ms\n", stage3_ms);
  std::printf("  plan auto (4 stages tried, chose %d)    %8.3f ms\n", chosen, auto_ms);
  std::printf("  peak RSS %ld KiB (%ld KiB before the layout was built)\n", rss_after, rss_before);
  std::printf(
      "{\"plan_stage3_ms\": %.3f, \"plan_auto_ms\": %.3f, \"floor_ms\": %.3f, "
      "\"peak_rss_kib\": %ld}\n",
      stage3_ms, auto_ms, floor_ms, rss_after);
  // Keeps the timed work observable so the compiler cannot drop it.
  if (sink == 0x5eed) std::printf("\n");
  return 0;
}
