// GlooOptions::background_start: whether Work::Start runs a collective on the collective thread
// at once, and the default, on only where this host's ranks leave a CPU free.

#include <algorithm>
#include <functional>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/common/usable_cpus.h"
#include "tests/runtime/comm/gloo_ranks.h"
#include "tests/runtime/common/pinned_to_one_cpu.h"

namespace zerod::comm {
namespace {

using ::zerod::testing::Scaled;

// What each of `world` ranks, created with the options `configure` sets for it, chose.
std::vector<bool> ChosenOnRanks(int64_t world,
                                const std::function<void(int64_t, GlooOptions&)>& configure) {
  std::vector<char> chosen(static_cast<size_t>(world), 0);
  OnRanksConfigured(world, configure, [&](int64_t r, GlooCommunicator& comm) {
    chosen[static_cast<size_t>(r)] = comm.StartsInBackground() ? 1 : 0;
  });
  return {chosen.begin(), chosen.end()};
}

// Ranks that gave different addresses sit on different hosts (127.0.0.1 and 127.0.0.2 are both
// this machine's loopback, but the count goes by address).
void DifferentHosts(int64_t r, GlooOptions& options) {
  options.hostname = "127.0.0.1";
  options.hostname.back() = static_cast<char>('1' + r);
}

TEST(GlooBackgroundStart, ByDefaultOnWhereTheCpusOutnumberTheRanksOnTheHost) {
  const bool one_host_of_two = UsableCpus() > 2;
  EXPECT_EQ(ChosenOnRanks(2, [](int64_t, GlooOptions&) {}), std::vector<bool>(2, one_host_of_two));
  // Each rank alone on its host: on wherever this thread may use two CPUs or more.
  const bool alone = UsableCpus() > 1;
  EXPECT_EQ(ChosenOnRanks(2, DifferentHosts), std::vector<bool>(2, alone));
  // Pinned to one CPU, no rank has one to spare, alone or not.
  PinnedToOneCpu pinned;
  EXPECT_EQ(ChosenOnRanks(2, DifferentHosts), std::vector<bool>(2, false));
}

TEST(GlooBackgroundStart, TheOptionOverridesTheDefault) {
  PinnedToOneCpu pinned;
  EXPECT_EQ(ChosenOnRanks(2, [](int64_t, GlooOptions& o) { o.background_start = true; }),
            std::vector<bool>(2, true));
  // Ranks may differ: Start is each rank's own affair. A rank given nothing still counts the
  // ranks of its host with the others.
  EXPECT_EQ(ChosenOnRanks(3,
                          [](int64_t r, GlooOptions& o) {
                            if (r == 1) o.background_start = true;
                            if (r == 2) o.background_start = false;
                          }),
            (std::vector<bool>{false, true, false}));
}

// Off, Work::Start leaves a collective to its caller's Wait: with an hour's grace, nothing runs it
// in the 300 ms before the callers wait, and then they do.
TEST(GlooBackgroundStart, OffAStartedCollectiveWaitsForItsCaller) {
  GlooOptions options;
  options.unclaimed_grace = absl::Hours(1);
  options.background_start = false;
  OnRanks(
      2,
      [&](int64_t r, Communicator& c) {
        std::vector<float> data(8, 1.0f + static_cast<float>(r));
        auto work = c.AllReduce(data.data(), 8, DType::kFloat32);
        work->Start();
        absl::SleepFor(absl::Milliseconds(300));
        EXPECT_EQ(c.BytesSent().count("all_reduce"), 0u) << "run before anyone waited";
        EXPECT_TRUE(work->Wait(Scaled(absl::Seconds(30))).ok());
        EXPECT_EQ(std::count(data.begin(), data.end(), 3.0f), 8);
      },
      absl::Seconds(60), -1, options);
}

}  // namespace
}  // namespace zerod::comm
