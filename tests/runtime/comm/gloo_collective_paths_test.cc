// Every Gloo collective on each of its paths: inline in the leads (small, all-to-all leads),
// after a header-only lead (large), and with leads to the ring neighbours only (large worlds,
// forced here with lead_all_to_all_max_world = 1), checked against results computed here; and
// the order check between collectives that take different paths.

#include <cmath>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/gloo/lead_exchange.h"
#include "runtime/common/half.h"
#include "runtime/common/mutex.h"
#include "tests/runtime/comm/gloo_ranks.h"

namespace zerod::comm {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kInlineFloats = internal::LeadExchange::kMaxInlineBytes / 4;

struct Path {
  const char* name;
  int64_t elements;  // per chunk (reduce-scatter, all-gather) or per buffer
  int64_t all_to_all_max_world;
};

// Small enough to travel inline, one element over, and large; each with all-to-all leads and with
// neighbour leads.
const Path kPaths[] = {
    {"inline", 37, 16},
    {"inline, largest", kInlineFloats, 16},
    {"ring, smallest", kInlineFloats + 1, 16},
    {"neighbour leads", 37, 1},
    {"neighbour leads, large", 3 * kInlineFloats + 5, 1},
};

GlooOptions OptionsFor(const Path& p) {
  GlooOptions o;
  o.lead_all_to_all_max_world = p.all_to_all_max_world;
  return o;
}

float Value(int64_t rank, int64_t i) {
  return static_cast<float>((rank + 1) * 0.37 + std::sin(static_cast<double>(i)));
}

// The rank-order float sum an inline collective computes.
float RankOrderSum(int64_t world, int64_t i) {
  float sum = Value(0, i);
  for (int64_t q = 1; q < world; ++q) sum += Value(q, i);
  return sum;
}

TEST(GlooCollectivePaths, AllReduceGivesEveryRankTheSameSum) {
  for (const Path& p : kPaths) {
    for (int64_t world : {1, 2, 3, 4}) {
      SCOPED_TRACE(testing::Message() << p.name << ", world " << world);
      const int64_t n = p.elements;
      std::vector<std::vector<float>> results(static_cast<size_t>(world));
      OnRanks(
          world,
          [&](int64_t r, Communicator& c) {
            std::vector<float> data(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) data[i] = Value(r, i);
            ASSERT_TRUE(c.AllReduce(data.data(), n, DType::kFloat32)->Wait(absl::Seconds(30)).ok());
            results[static_cast<size_t>(r)] = std::move(data);
          },
          absl::Seconds(30), -1, OptionsFor(p));
      for (int64_t r = 0; r < world; ++r) {
        ASSERT_EQ(results[r], results[0]) << "rank " << r << " differs from rank 0";
      }
      const bool inline_path = p.all_to_all_max_world >= world && n <= kInlineFloats;
      for (int64_t i = 0; i < n; ++i) {
        double want = 0;
        for (int64_t q = 0; q < world; ++q) want += Value(q, i);
        ASSERT_NEAR(results[0][i], want, 1e-5 * (1 + std::fabs(want))) << "element " << i;
        if (inline_path) {
          ASSERT_EQ(results[0][i], RankOrderSum(world, i)) << "element " << i;
        }
      }
    }
  }
}

TEST(GlooCollectivePaths, ReduceScatterAllGatherAndBroadcastOnEveryPath) {
  for (const Path& p : kPaths) {
    for (int64_t world : {1, 2, 3, 4}) {
      SCOPED_TRACE(testing::Message() << p.name << ", world " << world);
      const int64_t chunk = p.elements;
      OnRanks(
          world,
          [&](int64_t r, Communicator& c) {
            std::vector<float> data(static_cast<size_t>(world * chunk));
            for (int64_t i = 0; i < world * chunk; ++i) data[i] = Value(r, i);
            ASSERT_TRUE(
                c.ReduceScatter(data.data(), chunk, DType::kFloat32)->Wait(absl::Seconds(30)).ok());
            for (int64_t i = r * chunk; i < (r + 1) * chunk; ++i) {
              double want = 0;
              for (int64_t q = 0; q < world; ++q) want += Value(q, i);
              ASSERT_NEAR(data[i], want, 1e-5 * (1 + std::fabs(want))) << "element " << i;
            }
            std::vector<uint16_t> gathered(static_cast<size_t>(world * chunk), 0);
            for (int64_t i = 0; i < chunk; ++i) gathered[r * chunk + i] = FloatToBf16(Value(r, i));
            ASSERT_TRUE(c.AllGather(gathered.data(), chunk, DType::kBFloat16)
                            ->Wait(absl::Seconds(30))
                            .ok());
            for (int64_t q = 0; q < world; ++q) {
              for (int64_t i = 0; i < chunk; ++i) {
                ASSERT_EQ(gathered[q * chunk + i], FloatToBf16(Value(q, i))) << q << " " << i;
              }
            }
            const int64_t root = world - 1;
            std::vector<float> sent(static_cast<size_t>(chunk));
            for (int64_t i = 0; i < chunk; ++i) sent[i] = Value(r, i);
            ASSERT_TRUE(c.Broadcast(sent.data(), chunk, DType::kFloat32, root)
                            ->Wait(absl::Seconds(30))
                            .ok());
            for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(sent[i], Value(root, i));
            ASSERT_TRUE(c.Barrier()->Wait(absl::Seconds(30)).ok());
            EXPECT_EQ(c.BytesSent()["reduce_scatter"], (world - 1) * chunk * 4);
            EXPECT_EQ(c.BytesSent()["all_gather"], (world - 1) * chunk * 2);
            EXPECT_EQ(c.BytesReceived()["broadcast"], r == root ? 0 : chunk * 4);
          },
          absl::Seconds(30), -1, OptionsFor(p));
    }
  }
}

TEST(GlooCollectivePaths, AnInlineAllReduceCountsWhatItSends) {
  OnRanks(3, [&](int64_t, Communicator& c) {
    std::vector<float> data(100, 1.0f);
    ASSERT_TRUE(c.AllReduce(data.data(), 100, DType::kFloat32)->Wait(absl::Seconds(30)).ok());
    EXPECT_EQ(c.BytesSent()["all_reduce"], 2 * 100 * 4) << "its whole buffer to both peers";
    EXPECT_EQ(c.BytesReceived()["all_reduce"], 2 * 100 * 4);
  });
}

// One rank's collective is large (a header-only lead, then the ring), the other's small (data
// inline): the leads still fit each other's receives, so both ranks name the mismatch instead of
// Gloo aborting the process on a message longer than its receive.
TEST(GlooCollectivePaths, AMismatchBetweenALargeAndASmallCollectiveIsNamedOnBothRanks) {
  OnRanks(2, [&](int64_t r, Communicator& c) {
    const int64_t large = 2 * kInlineFloats;
    std::vector<float> data(static_cast<size_t>(2 * large), 1.0f);
    const absl::Status s =
        r == 0 ? c.AllGather(data.data(), large, DType::kFloat32)->Wait(absl::Seconds(20))
               : c.ReduceScatter(data.data(), 16, DType::kFloat32)->Wait(absl::Seconds(20));
    EXPECT_THAT(std::string(s.message()), HasSubstr("collective mismatch"));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(r == 0 ? "rank 1 called #1 reduce_scatter(fp32 x 16)"
                                 : "rank 0 called #1 all_gather(fp32 x 32768)"));
  });
}

TEST(GlooCollectivePaths, BroadcastsFromDifferentRootsAreAMismatch) {
  OnRanks(2, [&](int64_t r, Communicator& c) {
    std::vector<float> data(8, 1.0f);
    const absl::Status s = c.Broadcast(data.data(), 8, DType::kFloat32, r)->Wait(absl::Seconds(20));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("rank ", 1 - r, " called #1 broadcast(fp32 x 8) from rank ",
                                       1 - r)));
  });
}

// With leads to the neighbours only, the rank that differs is named by its neighbours, and every
// rank's collective fails (the ranks that saw it close their connections) instead of hanging.
TEST(GlooCollectivePaths, WithNeighbourLeadsAMismatchFailsEveryRank) {
  GlooOptions neighbours;
  neighbours.lead_all_to_all_max_world = 1;
  std::vector<absl::Status> status(4);
  OnRanks(
      4,
      [&](int64_t r, Communicator& c) {
        std::vector<float> data(64, 1.0f);
        status[static_cast<size_t>(r)] = (r == 2 ? c.AllReduce(data.data(), 10, DType::kFloat32)
                                                 : c.AllReduce(data.data(), 12, DType::kFloat32))
                                             ->Wait(absl::Seconds(20));
      },
      absl::Seconds(20), -1, neighbours);
  for (int64_t r = 0; r < 4; ++r) EXPECT_FALSE(status[r].ok()) << "rank " << r;
  EXPECT_THAT(std::string(status[1].message()),
              HasSubstr("rank 2 called #1 all_reduce(fp32 x 10)"));
  EXPECT_THAT(std::string(status[3].message()),
              HasSubstr("rank 2 called #1 all_reduce(fp32 x 10)"));
}

TEST(GlooCollectivePaths, ManySmallCollectivesInARowStayInStep) {
  // Each collective's leads are received into buffers posted when the previous one let go of
  // them; a thousand in a row, mixed kinds, check that none is matched with another's.
  OnRanks(3, [&](int64_t r, Communicator& c) {
    for (int64_t k = 0; k < 1000; ++k) {
      float x[3] = {static_cast<float>(r + k), 1.0f, 2.0f};
      if (k % 3 == 0) {
        ASSERT_TRUE(c.AllReduce(x, 1, DType::kFloat32)->Wait(absl::Seconds(30)).ok());
        ASSERT_EQ(x[0], static_cast<float>(3 * k + 3));
      } else if (k % 3 == 1) {
        x[r] = static_cast<float>(k * 10 + r);
        ASSERT_TRUE(c.AllGather(x, 1, DType::kFloat32)->Wait(absl::Seconds(30)).ok());
        for (int q = 0; q < 3; ++q) ASSERT_EQ(x[q], static_cast<float>(k * 10 + q));
      } else {
        ASSERT_TRUE(c.Barrier()->Wait(absl::Seconds(30)).ok());
      }
    }
  });
}

// Ranks given different lead options must not abort the process (a lead with data arriving at a
// rank that expects none): the leads' capacity does not depend on the options, and the difference
// is named.
TEST(GlooCollectivePaths, RanksGivenDifferentLeadOptionsAreNamedNotAborted) {
  auto store = std::make_shared<PrefixStore>("options", std::make_shared<InMemoryStore>());
  std::vector<absl::Status> status(2);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions options;
      options.timeout = absl::Seconds(20);
      options.lead_all_to_all_max_world = r == 0 ? 16 : 1;
      auto comm = GlooCommunicator::Create(store, r, 2, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> data(10, 1.0f);
      status[static_cast<size_t>(r)] =
          (*comm)->AllReduce(data.data(), 10, DType::kFloat32)->Wait(absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) {
    EXPECT_THAT(std::string(s.message()), HasSubstr("lead_all_to_all_max_world")) << s;
  }
}

// A waiter given at least the communicator's timeout runs a small collective on its own thread;
// a mismatch and an abort reach it there just as they reach the collective thread.
TEST(GlooCollectivePaths, ACallerRunningASmallCollectiveGetsMismatchesAndAborts) {
  OnRanks(2, [&](int64_t r, Communicator& c) {
    std::vector<float> data(8, 1.0f);
    const absl::Status s =
        c.AllReduce(data.data(), r == 0 ? 8 : 4, DType::kFloat32)->Wait(absl::InfiniteDuration());
    EXPECT_THAT(std::string(s.message()), HasSubstr("collective mismatch"));
  });
  Notification started;
  OnRanks(2, [&](int64_t r, Communicator& c) {
    if (r == 1) {
      started.WaitForNotification();  // silent: rank 0's all-reduce cannot complete
      absl::SleepFor(absl::Milliseconds(200));
      c.Abort(absl::AbortedError("the peer's test is over"));
      return;
    }
    std::vector<float> data(8, 1.0f);
    auto work = c.AllReduce(data.data(), 8, DType::kFloat32);
    std::thread aborter([&] {
      started.Notify();
      absl::SleepFor(absl::Milliseconds(100));
      c.Abort(absl::CancelledError("rank 1 was lost (test)"));
    });
    const absl::Status s = work->Wait(absl::InfiniteDuration());  // runs it here
    aborter.join();
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 was lost (test)"));
  });
}

}  // namespace
}  // namespace zerod::comm
