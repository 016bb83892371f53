// Every Gloo collective on each of its paths: inline in the leads (small, all-to-all leads),
// after a header-only lead (large: all-reduce split into our reduce-scatter and all-gather rings,
// or Gloo's own), and with leads to the ring neighbours only (large worlds, forced here with
// lead_all_to_all_max_world = 1), checked against results computed here; and the order check
// between collectives that take different paths.

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/gloo/chunks.h"
#include "runtime/comm/gloo/lead_exchange.h"
#include "runtime/comm/gloo/shared_memory_mesh.h"
#include "runtime/common/half.h"
#include "runtime/common/mutex.h"
#include "tests/runtime/comm/gloo_ranks.h"

namespace zerod::comm {
namespace {

using ::zerod::testing::Scaled;

using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr int64_t kInlineFloats = internal::LeadExchange::kMaxInlineBytes / 4;

// The most fp32 elements a collective other than a broadcast carries inline to each peer in a
// world of `world` ranks: 2 MiB worth at 2 ranks, 256 KiB worth at 3 and 4, kInlineFloats beyond.
constexpr int64_t InlineFloats(int64_t world) {
  return static_cast<int64_t>(
      internal::LeadExchange::MaxInlineBytes(internal::CollectiveKind::kAllReduce, world) / 4);
}
// An all-reduce at 2 ranks too large for the leads (whole in one exchange, or its chunks in two):
// it goes on the rings.
constexpr int64_t kTwoRankRingAllReduceFloats = 2 * InlineFloats(2) + 8;

constexpr int64_t kGlooAllReduce = 0;  // Gloo's own all-reduce above the inline sizes
constexpr int64_t kSplitAllReduce = int64_t{1} << 30;

struct Path {
  const char* name;
  // Per buffer, given the world size.
  int64_t (*elements)(int64_t world);
  int64_t all_to_all_max_world;
  int64_t split_all_reduce_max_bytes;
  bool shared_memory = false;  // the TCP paths, unless the path is shared memory's
};

// The fewest fp32 elements an all-reduce at `world` ranks takes through shared memory (a
// reduce-scatter or all-gather whose chunks hold them is over it too).
int64_t SharedMemoryMinFloats(int64_t world) {
  return std::max<int64_t>(GlooCommunicator::SharedMemoryMinBytes({}, world) / 4, 37);
}
// A shared-memory slot's region for one rank, in floats, at `world` ranks.
int64_t RegionFloats(int64_t world) {
  return static_cast<int64_t>(internal::SharedMemoryMesh::kSlotBytes) / world / 64 * 16;
}

// Small enough to travel inline, one element over, and large; each with all-to-all leads and with
// neighbour leads; large all-reduces split into our rings (counts that no world divides, so the
// last chunks are short) and through Gloo's.
const Path kPaths[] = {
    {"inline", [](int64_t) -> int64_t { return 37; }, 16, kGlooAllReduce},
    // Its broadcast at 4 ranks (256 KiB) is over the broadcast's inline limit there (128 KiB) and
    // goes along the chain.
    {"inline, largest", [](int64_t w) { return InlineFloats(w); }, 16, kGlooAllReduce},
    {"ring, smallest", [](int64_t w) { return InlineFloats(w) + 1; }, 16, kGlooAllReduce},
    {"two exchanges (split, chunks inline), smallest",
     [](int64_t w) { return InlineFloats(w) + 1; }, 16, kSplitAllReduce},
    {"ring, uneven chunks, split all-reduce", [](int64_t w) { return 5 * InlineFloats(w) + 7; }, 16,
     kSplitAllReduce},
    {"neighbour leads", [](int64_t) -> int64_t { return 37; }, 1, kGlooAllReduce},
    {"neighbour leads, large", [](int64_t) { return 3 * kInlineFloats + 5; }, 1, kGlooAllReduce},
    {"neighbour leads, large, split all-reduce", [](int64_t) { return 3 * kInlineFloats + 5; }, 1,
     kSplitAllReduce},
    // Through shared memory: the smallest, and uneven chunks in more pieces than a segment has
    // slots (each slot written again), the last piece short.
    {"shared memory, smallest", [](int64_t w) { return SharedMemoryMinFloats(w); }, 16,
     kGlooAllReduce, true},
    {"shared memory, uneven chunks, slots reused",
     [](int64_t w) {
       return (2 * static_cast<int64_t>(internal::SharedMemoryMesh::kSlots) + 1) * w *
                  RegionFloats(w) +
              2 * w + 1;
     },
     16, kGlooAllReduce, true},
};

GlooOptions OptionsFor(const Path& p) {
  GlooOptions o;
  o.lead_all_to_all_max_world = p.all_to_all_max_world;
  o.split_all_reduce_max_bytes = p.split_all_reduce_max_bytes;
  o.shared_memory = p.shared_memory;
  return o;
}

// Small integers: every order of summation gives the exact sum, so each rank's result can be
// compared bit for bit with the unsharded one.
float WholeValue(int64_t rank, int64_t i) { return static_cast<float>((rank * 7 + i) % 13) - 6; }

float Value(int64_t rank, int64_t i) {
  return static_cast<float>((rank + 1) * 0.37 + std::sin(static_cast<double>(i)));
}

// The rank-order float sum an inline collective computes.
float RankOrderSum(int64_t world, int64_t i) {
  float sum = Value(0, i);
  for (int64_t q = 1; q < world; ++q) sum += Value(q, i);
  return sum;
}

// Every rank's buffer after an all-reduce of Value(rank, i) for i < n at `world` ranks given
// `options`; `after(rank, communicator)` runs on each rank once it is done.
std::vector<std::vector<float>> AllReducedValues(
    int64_t world, int64_t n, const GlooOptions& options,
    const std::function<void(int64_t, Communicator&)>& after = nullptr) {
  std::vector<std::vector<float>> results(static_cast<size_t>(world));
  OnRanks(
      world,
      [&](int64_t r, Communicator& c) {
        std::vector<float> data(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) data[i] = Value(r, i);
        ASSERT_TRUE(
            c.AllReduce(data.data(), n, DType::kFloat32)->Wait(Scaled(absl::Seconds(30))).ok());
        results[static_cast<size_t>(r)] = std::move(data);
        if (after) after(r, c);
      },
      absl::Seconds(30), -1, options);
  return results;
}

TEST(GlooCollectivePaths, AllReduceGivesEveryRankTheSameSum) {
  for (const Path& p : kPaths) {
    for (int64_t world : {1, 2, 3, 4}) {
      SCOPED_TRACE(::testing::Message() << p.name << ", world " << world);
      const int64_t n = p.elements(world);
      const std::vector<std::vector<float>> results = AllReducedValues(world, n, OptionsFor(p));
      for (int64_t r = 0; r < world; ++r) {
        ASSERT_EQ(results[r], results[0]) << "rank " << r << " differs from rank 0";
      }
      // Inline and through shared memory each chunk is summed in rank order.
      const bool rank_order = (p.all_to_all_max_world >= world && n <= InlineFloats(world)) ||
                              (p.shared_memory && world > 1);
      for (int64_t i = 0; i < n; ++i) {
        double want = 0;
        for (int64_t q = 0; q < world; ++q) want += Value(q, i);
        ASSERT_NEAR(results[0][i], want, 1e-5 * (1 + std::fabs(want))) << "element " << i;
        if (rank_order) {
          ASSERT_EQ(results[0][i], RankOrderSum(world, i)) << "element " << i;
        }
      }
    }
  }
}

TEST(GlooCollectivePaths, AllReduceOnEveryPathEqualsTheUnshardedSumInEveryDtype) {
  for (const Path& p : kPaths) {
    for (int64_t world : {2, 3, 4}) {
      SCOPED_TRACE(::testing::Message() << p.name << ", world " << world);
      const int64_t n = p.elements(world);
      std::vector<float> want(static_cast<size_t>(n), 0.0f);
      for (int64_t q = 0; q < world; ++q) {
        for (int64_t i = 0; i < n; ++i) want[i] += WholeValue(q, i);
      }
      OnRanks(
          world,
          [&](int64_t r, Communicator& c) {
            std::vector<float> fp32(static_cast<size_t>(n));
            std::vector<uint16_t> bf16(static_cast<size_t>(n)), fp16(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i) {
              fp32[i] = WholeValue(r, i);
              bf16[i] = FloatToBf16(fp32[i]);
              fp16[i] = FloatToFp16(fp32[i]);
            }
            ASSERT_TRUE(
                c.AllReduce(fp32.data(), n, DType::kFloat32)->Wait(Scaled(absl::Seconds(30))).ok());
            ASSERT_TRUE(c.AllReduce(bf16.data(), n, DType::kBFloat16)
                            ->Wait(Scaled(absl::Seconds(30)))
                            .ok());
            ASSERT_TRUE(
                c.AllReduce(fp16.data(), n, DType::kFloat16)->Wait(Scaled(absl::Seconds(30))).ok());
            for (int64_t i = 0; i < n; ++i) {
              ASSERT_EQ(fp32[i], want[i]) << "rank " << r << " element " << i;
              ASSERT_EQ(bf16[i], FloatToBf16(want[i])) << "rank " << r << " element " << i;
              ASSERT_EQ(fp16[i], FloatToFp16(want[i])) << "rank " << r << " element " << i;
            }
          },
          absl::Seconds(30), -1, OptionsFor(p));
    }
  }
}

TEST(GlooCollectivePaths, ASplitAllReduceCountsTheChunksItSends) {
  // 10 elements per rank's chunk but the last (world 3, 29 elements: chunks of 10, 10, 9).
  GlooOptions split;
  split.lead_all_to_all_max_world = 1;  // never inline, however small
  split.split_all_reduce_max_bytes = kSplitAllReduce;
  OnRanks(
      3,
      [&](int64_t r, Communicator& c) {
        std::vector<float> data(29, 1.0f);
        ASSERT_TRUE(
            c.AllReduce(data.data(), 29, DType::kFloat32)->Wait(Scaled(absl::Seconds(30))).ok());
        for (float x : data) ASSERT_EQ(x, 3.0f);
        // Every chunk but its own in the reduce-scatter, every one but its successor's in the
        // all-gather; received: every one but its predecessor's, then every one but its own.
        const int64_t chunk[3] = {40, 40, 36};
        EXPECT_EQ(c.BytesSent()["all_reduce"], 2 * 116 - chunk[r] - chunk[(r + 1) % 3]);
        EXPECT_EQ(c.BytesReceived()["all_reduce"], 2 * 116 - chunk[(r + 2) % 3] - chunk[r]);
      },
      absl::Seconds(30), -1, split);
}

// An all-reduce whose chunks go inline, too large to go inline whole or sending much more that way
// (at 3 and 4 ranks over kMaxOneExchangeExtraBytes / (world - 2)): its reduce-scatter goes in the
// leads, its all-gather in a second exchange. At every world: the largest such (chunks of exactly
// the inline limit: 2 MiB at 2 ranks, 256 KiB at 3-4), one float more (rings), uneven chunks, the
// inline limit (one exchange at 2 ranks), and either side of the one-exchange limit at 3 and 4
// ranks; each route as AllReduceRouteOf chose it. Every rank gets the rank-order sum bit for bit
// inline (each chunk summed once, by its owner, in rank order), and counts what it moved: in one
// exchange its buffer to every other rank; in two every chunk but its own, then its own to every
// other rank; along the rings every chunk but its own, then every one but its successor's.
TEST(GlooCollectivePaths, AnAllReduceInTwoExchangesSumsInRankOrderAndCountsItsChunks) {
  using Route = GlooCommunicator::AllReduceRoute;
  for (int64_t world : {2, 3, 4}) {
    // At 2 ranks up to 2 MiB goes inline to the peer (the whole buffer in one exchange, then
    // chunks of up to 2 MiB in two), at 3-4 ranks 256 KiB.
    const int64_t inline_floats = InlineFloats(world);
    std::vector<std::pair<int64_t, Route>> cases = {
        {world * inline_floats, Route::kTwoExchanges},
        {world * inline_floats + 1, Route::kRings},
        {world * inline_floats - 5, Route::kTwoExchanges},
        {inline_floats + world, Route::kTwoExchanges},
        {inline_floats, world > 2 ? Route::kTwoExchanges : Route::kOneExchange}};
    if (world == 2) cases.push_back({kInlineFloats + 1, Route::kOneExchange});
    if (world > 2) {
      const int64_t one_most =
          static_cast<int64_t>(GlooCommunicator::kMaxOneExchangeExtraBytes) / 4 / (world - 2);
      cases.push_back({one_most, Route::kOneExchange});
      cases.push_back({one_most + 1, Route::kTwoExchanges});
    }
    for (const auto& [count, path] : cases) {
      // Copies: clang 14 cannot capture structured bindings in a lambda.
      const int64_t n = count;
      const Route route = path;
      SCOPED_TRACE(::testing::Message() << "world " << world << ", " << n << " floats");
      ASSERT_TRUE(GlooCommunicator::AllReduceRouteOf(n, DType::kFloat32, world, {}, false) ==
                  route);
      const internal::Chunks chunks = internal::Chunks::Split(world, n, 4);
      const auto chunk = [&](int64_t r) { return static_cast<int64_t>(chunks.bytes(r % world)); };
      GlooOptions tcp;
      tcp.shared_memory = false;
      const std::vector<std::vector<float>> results =
          AllReducedValues(world, n, tcp, [&](int64_t r, Communicator& c) {
            const int64_t bytes = n * 4;
            const int64_t sent = route == Route::kOneExchange ? (world - 1) * bytes
                                 : route == Route::kTwoExchanges
                                     ? bytes + (world - 2) * chunk(r)
                                     : 2 * bytes - chunk(r) - chunk(r + 1);
            const int64_t received =
                route == Route::kRings ? 2 * bytes - chunk(r + world - 1) - chunk(r) : sent;
            EXPECT_EQ(c.BytesSent()["all_reduce"], sent);
            EXPECT_EQ(c.BytesReceived()["all_reduce"], received);
          });
      for (int64_t r = 0; r < world; ++r) {
        ASSERT_EQ(results[r], results[0]) << "rank " << r << " differs from rank 0";
      }
      for (int64_t i = 0; i < n; ++i) {
        if (route != Route::kRings) {
          ASSERT_EQ(results[0][i], RankOrderSum(world, i)) << "element " << i;
        } else {
          ASSERT_NEAR(results[0][i], RankOrderSum(world, i), 1e-5) << "element " << i;
        }
      }
    }
  }
}

// Ranks whose all-reduces differ by one float, where one count goes in one exchange and the other
// in two, or both in two: named as a mismatch (the leads' phase tells one exchange from two), and
// no process is aborted.
TEST(GlooCollectivePaths, AllReducesThatDifferInTwoExchangesAreNamedNotAborted) {
  const int64_t one_most = static_cast<int64_t>(GlooCommunicator::kMaxOneExchangeExtraBytes) / 4;
  for (int64_t n : {one_most, 3 * kInlineFloats - 1}) {
    SCOPED_TRACE(::testing::Message() << n << " floats, rank 2 one more");
    std::vector<absl::Status> status(3);
    OnRanks(
        3,
        [&](int64_t r, Communicator& c) {
          std::vector<float> data(static_cast<size_t>(n + 1), 1.0f);
          status[static_cast<size_t>(r)] =
              c.AllReduce(data.data(), r == 2 ? n + 1 : n, DType::kFloat32)
                  ->Wait(Scaled(absl::Seconds(20)));
        },
        absl::Seconds(20));
    std::string all;
    bool named = false, phase_named = false;
    for (const absl::Status& st : status) {
      EXPECT_FALSE(st.ok());
      named |= absl::StrContains(st.message(), "collective mismatch");
      phase_named |= absl::StrContains(st.message(), "exchange 1 of 2");
      absl::StrAppend(&all, st.ToString(), " / ");
    }
    EXPECT_TRUE(named) << all;
    EXPECT_TRUE(phase_named) << all;
  }
}

TEST(GlooCollectivePaths, RanksGivenDifferentAllReduceSplitsAreNamedNotAborted) {
  const auto status =
      AllReduceWithOptionsPerRank(2, kTwoRankRingAllReduceFloats, [](int64_t r, GlooOptions& o) {
        o.split_all_reduce_max_bytes = r == 0 ? kSplitAllReduce : kGlooAllReduce;
      });
  for (const absl::Status& s : status) {
    EXPECT_THAT(std::string(s.message()), HasSubstr("split_all_reduce_max_bytes")) << s;
  }
}

TEST(GlooCollectivePaths, ReduceScatterAllGatherAndBroadcastOnEveryPath) {
  for (const Path& p : kPaths) {
    for (int64_t world : {1, 2, 3, 4}) {
      SCOPED_TRACE(::testing::Message() << p.name << ", world " << world);
      const int64_t chunk = p.elements(world);
      OnRanks(
          world,
          [&](int64_t r, Communicator& c) {
            std::vector<float> data(static_cast<size_t>(world * chunk));
            for (int64_t i = 0; i < world * chunk; ++i) data[i] = Value(r, i);
            ASSERT_TRUE(c.ReduceScatter(data.data(), chunk, DType::kFloat32)
                            ->Wait(Scaled(absl::Seconds(30)))
                            .ok());
            for (int64_t i = r * chunk; i < (r + 1) * chunk; ++i) {
              double want = 0;
              for (int64_t q = 0; q < world; ++q) want += Value(q, i);
              ASSERT_NEAR(data[i], want, 1e-5 * (1 + std::fabs(want))) << "element " << i;
            }
            std::vector<uint16_t> gathered(static_cast<size_t>(world * chunk), 0);
            for (int64_t i = 0; i < chunk; ++i) gathered[r * chunk + i] = FloatToBf16(Value(r, i));
            ASSERT_TRUE(c.AllGather(gathered.data(), chunk, DType::kBFloat16)
                            ->Wait(Scaled(absl::Seconds(30)))
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
                            ->Wait(Scaled(absl::Seconds(30)))
                            .ok());
            for (int64_t i = 0; i < chunk; ++i) ASSERT_EQ(sent[i], Value(root, i));
            ASSERT_TRUE(c.Barrier()->Wait(Scaled(absl::Seconds(30))).ok());
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
    ASSERT_TRUE(
        c.AllReduce(data.data(), 100, DType::kFloat32)->Wait(Scaled(absl::Seconds(30))).ok());
    EXPECT_EQ(c.BytesSent()["all_reduce"], 2 * 100 * 4) << "its whole buffer to both peers";
    EXPECT_EQ(c.BytesReceived()["all_reduce"], 2 * 100 * 4);
  });
}

// A group's buffers, as the engine cuts a step's gradients into segments: a 0-count one among
// them, chunk counts no world divides evenly into bytes of a kind, small enough together to travel
// inline in the lead or too large (every buffer's ring transfers in flight at once).
struct GroupCase {
  const char* name;
  // Given the world's InlineFloats (what goes inline to a peer).
  std::vector<int64_t> (*chunk_counts)(int64_t inline_floats);
  int64_t all_to_all_max_world;
  int64_t max_world = 4;  // the largest world run (large cases: 2, for the test's memory)
};

// An fp32 chunk of this many elements (4 MiB) goes in several 1 MiB pieces.
constexpr int64_t kPiecesFloats = int64_t{1} << 20;
// Chunks of 256 KiB and more go round in place, each in messages of its own (kInPlaceRingBytes):
// in fp32 a chunk of this many elements does, in bf16 not (packed with the small parts).
constexpr int64_t kInPlaceInFp32Only = 100000;
// A chunk of this many elements is packed in fp32 and bf16 (234 KiB and 117 KiB).
constexpr int64_t kPackedFloats = 60001;

using Counts = std::vector<int64_t>;
const GroupCase kGroups[] = {
    {"inline",
     [](int64_t) {
       return Counts{37, 0, 5, 1};
     },
     16},
    {"inline, largest",
     [](int64_t f) {
       return Counts{f / 2, 0, f / 2};
     },
     16},
    {"ring, just over inline together",
     [](int64_t f) {
       return Counts{f / 2, f / 2 + 1};
     },
     16},
    // bf16 chunks are half the bytes: inline in bf16 the previous case's would be.
    {"ring, over inline together in bf16 too",
     [](int64_t f) {
       return Counts{f, f + 1};
     },
     16},
    // Large chunks in place in pieces, in one ring, and small ones packed.
    {"ring, large and small parts",
     [](int64_t) {
       return Counts{kPiecesFloats + 3, 5, 0, 17, kPiecesFloats};
     },
     16, 3},
    {"ring, in place in fp32, packed in bf16",
     [](int64_t) {
       return Counts{kInPlaceInFp32Only, 3, kInPlaceInFp32Only};
     },
     16},
    // A chunk over 8 MiB is reduce-scattered in nine pieces in fp32, the last short (five in bf16).
    {"ring, a part in pieces", [](int64_t) { return Counts{2 * kPiecesFloats + 5}; }, 16, 3},
    {"ring, many large parts in one ring", [](int64_t) { return Counts(8, kPiecesFloats - 1000); },
     16, 2},
    // Packed steps of 2.9 MB (fp32) and 1.4 MB (bf16): pieces that start and end inside parts (in
    // bf16 at 3 ranks only: at 2 its 1.4 MB a peer goes inline).
    {"ring, small parts packed in pieces", [](int64_t) { return Counts(12, kPackedFloats); }, 16,
     3},
    // Small parts of more than 16 MiB a step in all: two packed rings.
    {"ring, more small parts than a packed ring holds",
     [](int64_t) { return Counts(72, kPackedFloats); }, 16, 2},
    {"ring, uneven",
     [](int64_t f) {
       return Counts{3 * f + 7, 0, 11, f + 1};
     },
     16},
    {"neighbour leads",
     [](int64_t) {
       return Counts{37, 0, 5};
     },
     1},
};

// What goes inline to a peer: 2 MiB of every kind at 2 ranks, where Gloo's messages leave only two
// one-way trips after the lead; at 3-4 ranks 256 KiB (a broadcast 256 and 128 KiB); beyond, 64 KiB.
TEST(GlooCollectivePaths, TheInlineLimitsPerKindAndWorld) {
  using internal::CollectiveKind;
  using internal::LeadExchange;
  for (CollectiveKind kind : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                              CollectiveKind::kAllGather, CollectiveKind::kBroadcast}) {
    SCOPED_TRACE(static_cast<int>(kind));
    const bool broadcast = kind == CollectiveKind::kBroadcast;
    EXPECT_EQ(LeadExchange::MaxInlineBytes(kind, 2), size_t{2} << 20);
    EXPECT_EQ(LeadExchange::MaxInlineBytes(kind, 3), size_t{256} << 10);
    EXPECT_EQ(LeadExchange::MaxInlineBytes(kind, 4), (broadcast ? size_t{128} : size_t{256}) << 10);
    EXPECT_EQ(LeadExchange::MaxInlineBytes(kind, 5), LeadExchange::kMaxInlineBytes);
    EXPECT_EQ(LeadExchange::MaxInlineBytes(kind, 16), LeadExchange::kMaxInlineBytes);
  }
}

TEST(GlooCollectivePaths, GroupedReduceScattersAndAllGathersEqualTheUnshardedSums) {
  for (const GroupCase& g : kGroups) {
    for (int64_t world = 1; world <= g.max_world; ++world) {
      for (bool shared_memory : {false, true}) {
        SCOPED_TRACE(::testing::Message() << g.name << ", world " << world
                                          << (shared_memory ? ", shared memory" : ", TCP only"));
        const Counts counts = g.chunk_counts(InlineFloats(world));
        int64_t per_peer = 0;
        for (int64_t c : counts) per_peer += c;
        GlooOptions options;
        options.lead_all_to_all_max_world = g.all_to_all_max_world;
        options.shared_memory = shared_memory;
        OnRanks(
            world,
            [&](int64_t r, Communicator& c) {
              // Buffer b's element i on rank q is WholeValue(q, i + 1000 * b): small integers, so
              // the sums are exact in every order and in bf16.
              std::vector<std::vector<float>> fp32;
              std::vector<std::vector<uint16_t>> bf16;
              std::vector<ChunkedBuffer> fp32_group, bf16_group;
              for (size_t b = 0; b < counts.size(); ++b) {
                const int64_t n = world * counts[b];
                fp32.emplace_back(static_cast<size_t>(n));
                bf16.emplace_back(static_cast<size_t>(n));
                for (int64_t i = 0; i < n; ++i) {
                  fp32[b][i] = WholeValue(r, i + 1000 * static_cast<int64_t>(b));
                  bf16[b][i] = FloatToBf16(fp32[b][i]);
                }
              }
              for (size_t b = 0; b < counts.size(); ++b) {
                fp32_group.push_back({fp32[b].data(), counts[b]});
                bf16_group.push_back({bf16[b].data(), counts[b]});
              }
              ASSERT_TRUE(c.ReduceScatterGroup(fp32_group, DType::kFloat32)
                              ->Wait(Scaled(absl::Seconds(120)))
                              .ok());
              ASSERT_TRUE(c.ReduceScatterGroup(bf16_group, DType::kBFloat16)
                              ->Wait(Scaled(absl::Seconds(120)))
                              .ok());
              for (size_t b = 0; b < counts.size(); ++b) {
                const int64_t chunk = counts[b];
                for (int64_t i = r * chunk; i < (r + 1) * chunk; ++i) {
                  float want = 0;
                  for (int64_t q = 0; q < world; ++q) {
                    want += WholeValue(q, i + 1000 * static_cast<int64_t>(b));
                  }
                  ASSERT_EQ(fp32[b][i], want) << "buffer " << b << " element " << i;
                  ASSERT_EQ(bf16[b][i], FloatToBf16(want)) << "buffer " << b << " element " << i;
                }
              }
              // Each rank's own chunk of every buffer to every rank; the others' chunks hold
              // garbage until then.
              for (size_t b = 0; b < counts.size(); ++b) {
                const int64_t chunk = counts[b];
                for (int64_t i = 0; i < world * chunk; ++i) {
                  const bool own = i / chunk == r;
                  fp32[b][i] = own ? Value(r, i + 1000 * static_cast<int64_t>(b)) : -1e30f;
                }
              }
              ASSERT_TRUE(c.AllGatherGroup(fp32_group, DType::kFloat32)
                              ->Wait(Scaled(absl::Seconds(120)))
                              .ok());
              for (size_t b = 0; b < counts.size(); ++b) {
                const int64_t chunk = counts[b];
                for (int64_t i = 0; i < world * chunk; ++i) {
                  ASSERT_EQ(fp32[b][i], Value(i / chunk, i + 1000 * static_cast<int64_t>(b)))
                      << "buffer " << b << " element " << i;
                }
              }
              // What moved: every rank's chunk of every buffer to each peer, bf16 and fp32.
              EXPECT_EQ(c.BytesSent()["reduce_scatter"], (world - 1) * per_peer * (4 + 2));
              EXPECT_EQ(c.BytesReceived()["reduce_scatter"], (world - 1) * per_peer * (4 + 2));
              EXPECT_EQ(c.BytesSent()["all_gather"], (world - 1) * per_peer * 4);
            },
            absl::Seconds(120), -1, options);
      }
    }
  }
}

// A split all-reduce whose chunks are reduce-scattered in pieces (1 MiB, summed while the next
// arrives, by turns in two scratch buffers; the last step's pieces sent on as the all-gather's
// first as soon as they are summed), the last piece short and the last chunk shorter than the
// others (a rank sends a longer chunk than it receives, or the reverse), at 2-4 ranks, in fp32
// and bf16: against the unsharded sum, exactly (small integers).
TEST(GlooCollectivePaths, ASplitAllReduceInPiecesEqualsTheUnshardedSum) {
  GlooOptions split;
  split.split_all_reduce_max_bytes = kSplitAllReduce;
  split.shared_memory = false;
  for (int64_t world : {2, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    // At 3 ranks chunks of 2^21 + 3 elements, the last 2^21 + 1.
    const int64_t n = 3 * 2 * kPiecesFloats + 7;
    OnRanks(
        world,
        [&](int64_t r, Communicator& c) {
          std::vector<float> data(static_cast<size_t>(n));
          std::vector<uint16_t> bf16(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) {
            data[i] = WholeValue(r, i);
            bf16[i] = FloatToBf16(data[i]);
          }
          ASSERT_TRUE(
              c.AllReduce(data.data(), n, DType::kFloat32)->Wait(Scaled(absl::Seconds(60))).ok());
          ASSERT_TRUE(
              c.AllReduce(bf16.data(), n, DType::kBFloat16)->Wait(Scaled(absl::Seconds(60))).ok());
          for (int64_t i = 0; i < n; ++i) {
            float want = 0;
            for (int64_t q = 0; q < world; ++q) want += WholeValue(q, i);
            ASSERT_EQ(data[i], want) << i;
            ASSERT_EQ(bf16[i], FloatToBf16(want)) << i;
          }
        },
        absl::Seconds(60), -1, split);
  }
}

// A group of one buffer is the single collective, and an empty group is a collective too: ranks
// mixing the two forms in the same order stay in step, inline and on the ring, with leads to
// every rank and to the neighbours only.
TEST(GlooCollectivePaths, AGroupOfOneIsTheSingleCollective) {
  for (int64_t chunk : {int64_t{10}, InlineFloats(3) + 1}) {
    for (int64_t all_to_all_max_world : {16, 1}) {
      SCOPED_TRACE(::testing::Message()
                   << "chunk " << chunk << ", all-to-all up to " << all_to_all_max_world);
      GlooOptions options;
      options.lead_all_to_all_max_world = all_to_all_max_world;
      OnRanks(
          3,
          [&](int64_t r, Communicator& c) {
            std::vector<float> data(static_cast<size_t>(3 * chunk), static_cast<float>(r + 1));
            auto first = r == 0 ? c.ReduceScatterGroup({{data.data(), chunk}}, DType::kFloat32)
                                : c.ReduceScatter(data.data(), chunk, DType::kFloat32);
            ASSERT_TRUE(first->Wait(Scaled(absl::Seconds(30))).ok());
            for (int64_t i = r * chunk; i < (r + 1) * chunk; ++i) ASSERT_EQ(data[i], 6.0f);
            auto second = r == 1 ? c.AllGatherGroup({{data.data(), chunk}}, DType::kFloat32)
                                 : c.AllGather(data.data(), chunk, DType::kFloat32);
            ASSERT_TRUE(second->Wait(Scaled(absl::Seconds(30))).ok());
            for (float x : data) ASSERT_EQ(x, 6.0f);
            ASSERT_TRUE(
                c.AllGatherGroup({}, DType::kFloat32)->Wait(Scaled(absl::Seconds(30))).ok());
            ASSERT_TRUE(c.Barrier()->Wait(Scaled(absl::Seconds(30))).ok());
          },
          absl::Seconds(30), -1, options);
    }
  }
}

// Ranks whose groups hold as many elements cut into other buffers (a segment plan that differs)
// would sum one buffer's chunk into another's: named on both ranks, inline and on the ring.
TEST(GlooCollectivePaths, GroupsCutDifferentlyAreAMismatchNamedOnBothRanks) {
  for (int64_t unit : {int64_t{8}, InlineFloats(2)}) {
    SCOPED_TRACE(::testing::Message() << "unit " << unit);
    OnRanks(2, [&](int64_t r, Communicator& c) {
      std::vector<float> a(static_cast<size_t>(6 * unit), 1.0f), b(a.size(), 1.0f);
      const std::vector<ChunkedBuffer> group =
          r == 0 ? std::vector<ChunkedBuffer>{{a.data(), 2 * unit}, {b.data(), unit}}
                 : std::vector<ChunkedBuffer>{{a.data(), unit}, {b.data(), 2 * unit}};
      const absl::Status s =
          c.ReduceScatterGroup(group, DType::kFloat32)->Wait(Scaled(absl::Seconds(20)));
      EXPECT_THAT(
          std::string(s.message()),
          HasSubstr(absl::StrCat("rank ", 1 - r, " called #1 reduce_scatter(fp32 x ", 3 * unit,
                                 " in 2 buffers) with its buffers cut otherwise")))
          << s;
    });
  }
  // A group against one buffer of as many elements names the group's buffers.
  OnRanks(2, [&](int64_t r, Communicator& c) {
    std::vector<float> a(32, 1.0f), b(32, 1.0f);
    const absl::Status s =
        (r == 0 ? c.AllGatherGroup({{a.data(), 8}, {b.data(), 8}}, DType::kFloat32)
                : c.AllGather(a.data(), 16, DType::kFloat32))
            ->Wait(Scaled(absl::Seconds(20)));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(r == 0 ? "rank 1 called #1 all_gather(fp32 x 16)"
                                 : "rank 0 called #1 all_gather(fp32 x 16 in 2 buffers)"))
        << s;
  });
}

// One rank's collective is large (a header-only lead, then the ring), the other's small (data
// inline): the leads still fit each other's receives, so both ranks name the mismatch instead of
// Gloo aborting the process on a message longer than its receive.
TEST(GlooCollectivePaths, AMismatchBetweenALargeAndASmallCollectiveIsNamedOnBothRanks) {
  OnRanks(2, [&](int64_t r, Communicator& c) {
    const int64_t large = InlineFloats(2) + 1;
    std::vector<float> data(static_cast<size_t>(2 * large), 1.0f);
    const absl::Status s =
        r == 0 ? c.AllGather(data.data(), large, DType::kFloat32)->Wait(Scaled(absl::Seconds(20)))
               : c.ReduceScatter(data.data(), 16, DType::kFloat32)->Wait(Scaled(absl::Seconds(20)));
    EXPECT_THAT(std::string(s.message()), HasSubstr("collective mismatch"));
    EXPECT_THAT(
        std::string(s.message()),
        HasSubstr(r == 0 ? std::string("rank 1 called #1 reduce_scatter(fp32 x 16)")
                         : absl::StrCat("rank 0 called #1 all_gather(fp32 x ", large, ")")));
  });
}

TEST(GlooCollectivePaths, BroadcastsFromDifferentRootsAreAMismatch) {
  OnRanks(2, [&](int64_t r, Communicator& c) {
    std::vector<float> data(8, 1.0f);
    const absl::Status s =
        c.Broadcast(data.data(), 8, DType::kFloat32, r)->Wait(Scaled(absl::Seconds(20)));
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
                                             ->Wait(Scaled(absl::Seconds(20)));
      },
      absl::Seconds(20), -1, neighbours);
  for (int64_t r = 0; r < 4; ++r) EXPECT_FALSE(status[r].ok()) << "rank " << r;
  EXPECT_THAT(std::string(status[1].message()),
              HasSubstr("rank 2 called #1 all_reduce(fp32 x 10)"));
  EXPECT_THAT(std::string(status[3].message()),
              HasSubstr("rank 2 called #1 all_reduce(fp32 x 10)"));
}

// A broadcast's receivers wait for the root and their ring predecessor, not for the others: at 4
// ranks, rank 3 starts its broadcast only once ranks 1 and 2 have completed theirs (with leads
// waited for from every rank, a deadlock until the timeout). Inline only: a larger broadcast's
// data goes down Gloo's tree, whose inner ranks forward it.
TEST(GlooCollectivePaths, ABroadcastReceiverWaitsForTheRootAndItsPredecessorOnly) {
  Notification rank1_done, rank2_done;
  OnRanks(4, [&](int64_t r, Communicator& c) {
    std::vector<float> data(16, static_cast<float>(r));
    // Ranks 1 and 2 give up first, if they must: then rank 3 starts and the others end.
    if (r == 3) {
      rank1_done.WaitForNotificationWithTimeout(Scaled(absl::Seconds(40)));
      rank2_done.WaitForNotificationWithTimeout(Scaled(absl::Seconds(40)));
    }
    const absl::Status s =
        c.Broadcast(data.data(), 16, DType::kFloat32, 0)->Wait(Scaled(absl::Seconds(20)));
    if (r == 1) rank1_done.Notify();
    if (r == 2) rank2_done.Notify();
    ASSERT_TRUE(s.ok()) << "rank " << r << ": " << s;
    for (float x : data) ASSERT_EQ(x, 0.0f);
    ASSERT_TRUE(c.Barrier()->Wait(Scaled(absl::Seconds(30))).ok());
  });
}

// Rank 2 disagrees with rank 1, another receiver, and with the root: the root (whose predecessor
// rank 2 is) names rank 2, rank 2 names its predecessor, and rank 1 fails no later than its next
// collective.
TEST(GlooCollectivePaths, AMismatchBetweenTwoBroadcastReceiversFailsEveryRank) {
  std::vector<absl::Status> status(3);
  OnRanks(3, [&](int64_t r, Communicator& c) {
    std::vector<float> data(16, 1.0f);
    absl::Status s = c.Broadcast(data.data(), r == 2 ? 12 : 16, DType::kFloat32, 0)
                         ->Wait(Scaled(absl::Seconds(20)));
    if (s.ok()) s = c.Barrier()->Wait(Scaled(absl::Seconds(20)));
    status[static_cast<size_t>(r)] = s;
  });
  for (int64_t r = 0; r < 3; ++r) EXPECT_FALSE(status[r].ok()) << "rank " << r;
  EXPECT_THAT(std::string(status[0].message()),
              HasSubstr("rank 2 called #1 broadcast(fp32 x 12) from rank 0"));
  EXPECT_THAT(std::string(status[2].message()),
              HasSubstr("rank 1 called #1 broadcast(fp32 x 16) from rank 0"));
}

// Ranks that disagree on the root, none of them the root in the eyes of the rank it waits for:
// still named at once, by the ranks whose predecessor sees it otherwise (every rank checks its
// predecessor's lead first, and every rank sends one to its successor).
TEST(GlooCollectivePaths, BroadcastReceiversThatDisagreeOnTheRootAreNamed) {
  std::vector<absl::Status> status(3);
  OnRanks(3, [&](int64_t r, Communicator& c) {
    std::vector<float> data(16, 1.0f);
    const int64_t root = r == 0 ? 0 : r == 1 ? 2 : 0;  // rank 1 waits for rank 2, which waits for 0
    absl::Status s =
        c.Broadcast(data.data(), 16, DType::kFloat32, root)->Wait(Scaled(absl::Seconds(20)));
    if (s.ok()) s = c.Barrier()->Wait(Scaled(absl::Seconds(20)));
    status[static_cast<size_t>(r)] = s;
  });
  for (int64_t r = 0; r < 3; ++r) EXPECT_FALSE(status[r].ok()) << "rank " << r;
  // Rank 0, whose predecessor agrees with it, learns of it from the connections the others close.
  EXPECT_THAT(std::string(status[0].message()),
              AnyOf(HasSubstr("collective mismatch"), HasSubstr("its own error says why")));
  EXPECT_THAT(std::string(status[1].message()),
              HasSubstr("rank 0 called #1 broadcast(fp32 x 16) from rank 0"));
  EXPECT_THAT(std::string(status[2].message()),
              HasSubstr("rank 1 called #1 broadcast(fp32 x 16) from rank 2"));
}

// Every rank takes its successor for the root, so no rank sends its lead to all: each still
// hears from its predecessor and names the difference, instead of waiting for the timeout.
TEST(GlooCollectivePaths, BroadcastsWhereNoRankIsTheRootAreNamed) {
  std::vector<absl::Status> status(3);
  OnRanks(3, [&](int64_t r, Communicator& c) {
    std::vector<float> data(16, 1.0f);
    status[static_cast<size_t>(r)] =
        c.Broadcast(data.data(), 16, DType::kFloat32, (r + 1) % 3)->Wait(Scaled(absl::Seconds(20)));
  });
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_THAT(std::string(status[r].message()),
                HasSubstr(absl::StrCat("rank ", (r + 2) % 3,
                                       " called #1 broadcast(fp32 x 16) from "
                                       "rank ",
                                       r)))
        << "rank " << r;
  }
}

// A large broadcast whose receiver expects fewer bytes than the root sends (and is not the root's
// predecessor, so the root sends): the receiver checks the root's lead before Gloo posts its
// receive, so the process is not aborted on a message longer than the receive; named instead.
TEST(GlooCollectivePaths, ALargeBroadcastReceiverExpectingLessIsNamedNotAborted) {
  std::vector<absl::Status> status(4);
  OnRanks(4, [&](int64_t r, Communicator& c) {
    const int64_t large = 2 * kInlineFloats;
    std::vector<float> data(static_cast<size_t>(large), 1.0f);
    status[static_cast<size_t>(r)] =
        c.Broadcast(data.data(), r == 2 ? large - 1 : large, DType::kFloat32, 0)
            ->Wait(Scaled(absl::Seconds(20)));
  });
  EXPECT_THAT(std::string(status[2].message()), HasSubstr("collective mismatch"));
  EXPECT_THAT(std::string(status[3].message()),
              HasSubstr(absl::StrCat("rank 2 called #1 broadcast(fp32 x ", 2 * kInlineFloats - 1)));
}

// `world` ranks broadcast `count` floats from every root in turn, `rounds` times over: each gets
// the root's values, and each counts (world - 1) buffers sent and received per root (the root
// sends to every other rank inline or through the tree; along the chain each rank sends once, but
// the root's predecessor).
void ExpectBroadcastsFromEveryRoot(int64_t world, int64_t count, int rounds) {
  SCOPED_TRACE(::testing::Message() << "world " << world << ", " << count << " floats");
  OnRanks(world, [&](int64_t r, Communicator& c) {
    std::vector<float> data(static_cast<size_t>(count));
    for (int round = 0; round < rounds; ++round) {
      for (int64_t root = 0; root < world; ++root) {
        for (int64_t i = 0; i < count; ++i) data[i] = Value(r, i);
        const absl::Status s =
            c.Broadcast(data.data(), count, DType::kFloat32, root)->Wait(Scaled(absl::Seconds(30)));
        ASSERT_TRUE(s.ok()) << s;
        for (int64_t i = 0; i < count; ++i) ASSERT_EQ(data[i], Value(root, i)) << i;
      }
    }
    EXPECT_EQ(c.BytesSent()["broadcast"], rounds * (world - 1) * count * 4);
    EXPECT_EQ(c.BytesReceived()["broadcast"], rounds * (world - 1) * count * 4);
  });
}

// A broadcast too large to go inline (at 2 ranks, where that is 2 MiB, all but the largest do),
// from every root (Gloo's tree differs with the root; the chain starts at it), in one piece of the
// chain and in several with a short last one. At 2 ranks the chain takes over from the tree at
// 8 MiB: a float under it, and 1 MiB pieces with a short last one over it.
TEST(GlooCollectivePaths, ALargeBroadcastReachesEveryRankFromEveryRoot) {
  const int64_t piece_floats = (int64_t{256} << 10) / 4;
  for (int64_t world : {2, 3, 4}) {
    for (int64_t count : {piece_floats, 3 * piece_floats + 5, 20 * piece_floats + 3}) {
      ExpectBroadcastsFromEveryRoot(world, count, 1);
    }
  }
  constexpr int64_t kTwoRankChainFloats = internal::LeadExchange::kMinTwoRankChainBytes / 4;
  using Route = internal::LeadExchange::BroadcastRoute;
  ASSERT_EQ(internal::LeadExchange::RouteOf((kTwoRankChainFloats - 1) * 4, 2, true), Route::kTree);
  ASSERT_EQ(internal::LeadExchange::RouteOf(kTwoRankChainFloats * 4, 2, true), Route::kChain);
  for (int64_t count : {kTwoRankChainFloats - 1, kTwoRankChainFloats + 3}) {
    ExpectBroadcastsFromEveryRoot(2, count, 1);
  }
}

// A large broadcast in which one rank has another count, larger or smaller: whichever rank it is
// (the root, the root's successor, its predecessor), the leads name it, and no process is
// aborted on a message longer than its receive (a receiver checks the root's lead before Gloo's
// broadcast posts its receive).
TEST(GlooCollectivePaths, ALargeBroadcastWithAnotherCountOnAnyRankIsNamedNotAborted) {
  const int64_t piece_floats = (int64_t{256} << 10) / 4;
  const int64_t count = 2 * piece_floats + 100;
  for (int64_t other : {count - 7, count + 7, count + piece_floats, count - piece_floats}) {
    for (int64_t odd : {0, 1, 3}) {
      SCOPED_TRACE(::testing::Message() << "rank " << odd << " has " << other << " floats");
      std::vector<absl::Status> status(4);
      OnRanks(
          4,
          [&](int64_t r, Communicator& c) {
            std::vector<float> data(static_cast<size_t>(count + piece_floats), 1.0f);
            status[static_cast<size_t>(r)] =
                c.Broadcast(data.data(), r == odd ? other : count, DType::kFloat32, 0)
                    ->Wait(Scaled(absl::Seconds(20)));
          },
          absl::Seconds(20));
      bool named = false;
      for (const absl::Status& st : status) {
        named |= absl::StrContains(st.message(), absl::StrCat("broadcast(fp32 x ", other));
      }
      EXPECT_TRUE(named) << status[0] << " / " << status[1] << " / " << status[2] << " / "
                         << status[3];
      EXPECT_FALSE(status[static_cast<size_t>(odd)].ok());
    }
  }
}

// A broadcast up to its world's kMaxInlineBroadcastBytes travels in the root's lead (at 2 ranks a
// frame 32x a lead's usual limit), one float more along the chain or through Gloo's tree: both
// reach every rank from every root, twice over, and are counted.
TEST(GlooCollectivePaths, ABroadcastAtAndOverItsWorldsInlineLimitReachesEveryRank) {
  for (int64_t world : {2, 3, 4}) {
    const int64_t limit_floats = static_cast<int64_t>(
        internal::LeadExchange::MaxInlineBytes(internal::CollectiveKind::kBroadcast, world) / 4);
    ASSERT_GT(limit_floats, kInlineFloats);
    for (int64_t count : {kInlineFloats + 1, limit_floats, limit_floats + 1}) {
      ExpectBroadcastsFromEveryRoot(world, count, 2);
    }
  }
}

// At 2 ranks, a receiver given another count than the inline root's (one that goes inline, through
// the tree or along the chain), or a receiver that thinks it is the root too, is named on some
// rank; neither rank is aborted or left waiting.
TEST(GlooCollectivePaths, AtTwoRanksAnInlineBroadcastMismatchIsNamedNotAborted) {
  constexpr int64_t kLimitFloats = internal::LeadExchange::kMaxInlineBroadcastBytes[2] / 4;
  const int64_t count = kLimitFloats / 2 + 3;
  struct Case {
    int64_t other_count;  // rank 1's
    int64_t other_root;   // rank 1's
  };
  constexpr int64_t kChainFloats = internal::LeadExchange::kMinTwoRankChainBytes / 4 + 5;
  for (const Case& k :
       {Case{count - 7, 0}, Case{count + 7, 0}, Case{kLimitFloats + 1, 0}, Case{count, 1},
        Case{2 * kLimitFloats, 1}, Case{kChainFloats, 0}, Case{kChainFloats, 1}}) {
    SCOPED_TRACE(::testing::Message() << "rank 1: " << k.other_count << " from " << k.other_root);
    std::vector<absl::Status> status(2);
    OnRanks(
        2,
        [&](int64_t r, Communicator& c) {
          std::vector<float> data(static_cast<size_t>(kChainFloats), 1.0f);
          status[static_cast<size_t>(r)] = c.Broadcast(data.data(), r == 1 ? k.other_count : count,
                                                       DType::kFloat32, r == 1 ? k.other_root : 0)
                                               ->Wait(Scaled(absl::Seconds(20)));
        },
        absl::Seconds(20));
    EXPECT_FALSE(status[0].ok());
    EXPECT_FALSE(status[1].ok());
    EXPECT_TRUE(absl::StrContains(status[0].message(), "collective mismatch") ||
                absl::StrContains(status[1].message(), "collective mismatch"))
        << status[0] << " / " << status[1];
  }
}

// `world` ranks broadcast: `odd_ranks` `large` floats from `odd_root`, the others `small` from
// root 0.
// Every rank fails (none is aborted), and some rank names the mismatch. Where both go along the
// chain or through the tree, every rank fails that broadcast; where one view goes inline, a rank
// of it may finish (its root waits for its predecessor's lead alone, a receiver for the root's and
// its predecessor's, which may agree with it), so a rank whose broadcast ended must fail its next
// collective.
void ExpectTwoRootsOfTwoSizesNamed(int64_t world, const std::vector<int64_t>& odd_ranks,
                                   int64_t odd_root, int64_t small, int64_t large,
                                   bool one_goes_inline = false) {
  std::vector<absl::Status> status(static_cast<size_t>(world));
  OnRanks(
      world,
      [&](int64_t r, Communicator& c) {
        std::vector<float> data(static_cast<size_t>(large), 1.0f);
        const bool odd = std::count(odd_ranks.begin(), odd_ranks.end(), r) > 0;
        absl::Status s =
            c.Broadcast(data.data(), odd ? large : small, DType::kFloat32, odd ? odd_root : 0)
                ->Wait(Scaled(absl::Seconds(20)));
        if (s.ok() && one_goes_inline) s = c.Barrier()->Wait(Scaled(absl::Seconds(20)));
        status[static_cast<size_t>(r)] = s;
      },
      absl::Seconds(20));
  bool named = false;
  std::string all;
  for (const absl::Status& st : status) {
    EXPECT_FALSE(st.ok());
    named |= absl::StrContains(st.message(), "collective mismatch");
    absl::StrAppend(&all, st.ToString(), " / ");
  }
  EXPECT_TRUE(named) << all;
}

// The fewest floats of a broadcast too large to go inline in a world of `world` ranks.
int64_t OverInlineFloats(int64_t world) {
  return static_cast<int64_t>(
             internal::LeadExchange::MaxInlineBytes(internal::CollectiveKind::kBroadcast, world) /
             4) +
         1;
}

TEST(GlooCollectivePaths, LargeBroadcastsFromTwoRootsOfTwoSizesAreNamedNotAborted) {
  // In root 0's binomial tree at 8 ranks rank 6's data comes from rank 2, whose lead a sparse
  // broadcast would never show rank 6: Gloo then aborted the process (a message longer than the
  // receive posted).
  ExpectTwoRootsOfTwoSizesNamed(8, {1, 2}, 2, OverInlineFloats(8), 2 * OverInlineFloats(8));
}

// At 4 ranks a large broadcast goes along the chain with sparse leads: a rank takes its data from
// its predecessor only after checking the predecessor's lead.
TEST(GlooCollectivePaths, ChainBroadcastsFromTwoRootsOfTwoSizesAreNamedNotAborted) {
  ExpectTwoRootsOfTwoSizesNamed(4, {1, 2}, 2, OverInlineFloats(4), 2 * OverInlineFloats(4));
  ExpectTwoRootsOfTwoSizesNamed(4, {2, 3}, 2, OverInlineFloats(4), 2 * OverInlineFloats(4));
}

// One view inline, the other along the chain (3-4 ranks) or through the tree (2 ranks, under
// 8 MiB).
TEST(GlooCollectivePaths, InlineAndLargerBroadcastsFromTwoRootsAreNamedNotAborted) {
  for (int64_t world : {2, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    const int64_t inline_floats = OverInlineFloats(world) - 1;
    ExpectTwoRootsOfTwoSizesNamed(world, {world - 1}, world - 1, inline_floats, 2 * inline_floats,
                                  true);
    if (world > 2) {
      ExpectTwoRootsOfTwoSizesNamed(world, {1, world - 1}, world - 1, inline_floats,
                                    2 * inline_floats, true);
    }
  }
}

TEST(GlooCollectivePaths, ABroadcastFromARankOutsideTheWorldFailsNamingIt) {
  for (int64_t count : {int64_t{4}, 2 * kInlineFloats}) {
    OnRanks(2, [&](int64_t, Communicator& c) {
      std::vector<float> data(static_cast<size_t>(count), 1.0f);
      const absl::Status s =
          c.Broadcast(data.data(), count, DType::kFloat32, 2)->Wait(Scaled(absl::Seconds(20)));
      EXPECT_THAT(std::string(s.message()), HasSubstr("no rank 2 to broadcast from (2 ranks)"));
    });
  }
}

TEST(GlooCollectivePaths, ManySmallCollectivesInARowStayInStep) {
  // Each collective's leads are received into buffers posted when the previous one let go of
  // them; a thousand in a row, mixed kinds, check that none is matched with another's.
  OnRanks(3, [&](int64_t r, Communicator& c) {
    for (int64_t k = 0; k < 1000; ++k) {
      float x[3] = {static_cast<float>(r + k), 1.0f, 2.0f};
      if (k % 3 == 0) {
        ASSERT_TRUE(c.AllReduce(x, 1, DType::kFloat32)->Wait(Scaled(absl::Seconds(30))).ok());
        ASSERT_EQ(x[0], static_cast<float>(3 * k + 3));
      } else if (k % 3 == 1) {
        x[r] = static_cast<float>(k * 10 + r);
        ASSERT_TRUE(c.AllGather(x, 1, DType::kFloat32)->Wait(Scaled(absl::Seconds(30))).ok());
        for (int q = 0; q < 3; ++q) ASSERT_EQ(x[q], static_cast<float>(k * 10 + q));
      } else {
        ASSERT_TRUE(c.Barrier()->Wait(Scaled(absl::Seconds(30))).ok());
      }
    }
  });
}

TEST(GlooCollectivePaths, BroadcastsFromEveryRootInARowStayInStep) {
  // A broadcast's receivers send no lead to each other, so a rank's two receives from a peer
  // wait across collectives for the next lead it sends: runs of broadcasts, small and large,
  // from changing roots, between the other kinds.
  for (int64_t world : {3, 4}) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    OnRanks(world, [&](int64_t r, Communicator& c) {
      std::vector<float> large(static_cast<size_t>(kInlineFloats + 3));
      for (int64_t k = 0; k < 300; ++k) {
        const int64_t root = (k / 2) % world;
        if (k % 7 == 6) {
          float x = static_cast<float>(r);
          ASSERT_TRUE(c.AllReduce(&x, 1, DType::kFloat32)->Wait(Scaled(absl::Seconds(30))).ok());
          ASSERT_EQ(x, static_cast<float>(world * (world - 1) / 2));
        } else if (k % 5 == 4) {
          std::fill(large.begin(), large.end(), static_cast<float>(r * 1000 + k));
          ASSERT_TRUE(
              c.Broadcast(large.data(), static_cast<int64_t>(large.size()), DType::kFloat32, root)
                  ->Wait(Scaled(absl::Seconds(30)))
                  .ok());
          for (float x : large) ASSERT_EQ(x, static_cast<float>(root * 1000 + k));
        } else {
          float x[2] = {static_cast<float>(r), static_cast<float>(k)};
          ASSERT_TRUE(
              c.Broadcast(x, 2, DType::kFloat32, root)->Wait(Scaled(absl::Seconds(30))).ok());
          ASSERT_EQ(x[0], static_cast<float>(root));
          ASSERT_EQ(x[1], static_cast<float>(k));
        }
      }
    });
  }
}

// Ranks given different lead options must not abort the process (a lead with data arriving at a
// rank that expects none): the leads' capacity does not depend on the options, and the difference
// is named.
TEST(GlooCollectivePaths, RanksGivenDifferentLeadOptionsAreNamedNotAborted) {
  const auto status = AllReduceWithOptionsPerRank(
      2, 10, [](int64_t r, GlooOptions& o) { o.lead_all_to_all_max_world = r == 0 ? 16 : 1; });
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
  // Rank 1 aborts only after rank 0 did: had its connections closed first, rank 0's collective
  // could fail of that instead (a thread woken late on a loaded machine).
  Notification started, aborted;
  OnRanks(2, [&](int64_t r, Communicator& c) {
    if (r == 1) {
      started.WaitForNotification();  // silent: rank 0's all-reduce cannot complete
      aborted.WaitForNotification();
      c.Abort(absl::AbortedError("the peer's test is over"));
      return;
    }
    std::vector<float> data(8, 1.0f);
    auto work = c.AllReduce(data.data(), 8, DType::kFloat32);
    std::thread aborter([&] {
      started.Notify();
      absl::SleepFor(Scaled(absl::Milliseconds(100)));  // the caller is running it by then
      c.Abort(absl::CancelledError("rank 1 was lost (test)"));
      aborted.Notify();
    });
    const absl::Status s = work->Wait(absl::InfiniteDuration());  // runs it here
    aborter.join();
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 was lost (test)"));
  });
}

// A collective too large to go inline is run by a caller that waits for it at once too: a
// mismatch and an abort reach it there.
TEST(GlooCollectivePaths, ACallerRunningALargeCollectiveGetsMismatchesAndAborts) {
  const int64_t n = kTwoRankRingAllReduceFloats;
  OnRanks(2, [&](int64_t r, Communicator& c) {
    std::vector<float> data(static_cast<size_t>(n), 1.0f);
    const absl::Status s = c.AllReduce(data.data(), r == 0 ? n : n - 1, DType::kFloat32)
                               ->Wait(absl::InfiniteDuration());
    EXPECT_THAT(std::string(s.message()), HasSubstr("collective mismatch"));
  });
  Notification started, aborted;  // rank 1 aborts after rank 0 (see above)
  OnRanks(2, [&](int64_t r, Communicator& c) {
    std::vector<float> data(static_cast<size_t>(n), 1.0f);
    if (r == 1) {
      // Silent: rank 0's reduce-scatter cannot complete.
      started.WaitForNotification();
      aborted.WaitForNotification();
      c.Abort(absl::AbortedError("the peer's test is over"));
      return;
    }
    auto work = c.ReduceScatter(data.data(), n / 2, DType::kFloat32);
    std::thread aborter([&] {
      started.Notify();
      absl::SleepFor(Scaled(absl::Milliseconds(100)));  // the caller is running it by then
      c.Abort(absl::CancelledError("rank 1 was lost (test)"));
      aborted.Notify();
    });
    const absl::Status s = work->Wait(absl::InfiniteDuration());  // runs it here
    aborter.join();
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 was lost (test)"));
  });
}

// A collective issued and not waited for (to overlap with other work) runs on the collective
// thread: rank 1's all-reduce can only complete once rank 0's has run, and rank 0 waits only after
// that. A waiter with a timeout shorter than the communicator's has the collective thread run its
// collective, and those issued with it, at once.
TEST(GlooCollectivePaths, ACollectiveNobodyWaitsForYetStillRuns) {
  for (const int64_t n : {int64_t{8}, kTwoRankRingAllReduceFloats}) {
    SCOPED_TRACE(::testing::Message() << n << " floats");
    Notification done;
    OnRanks(
        2,
        [&](int64_t r, Communicator& c) {
          std::vector<float> a(static_cast<size_t>(n), 1.0f), b(static_cast<size_t>(n), 2.0f);
          auto first = c.AllReduce(a.data(), n, DType::kFloat32);
          auto second = c.AllReduce(b.data(), n, DType::kFloat32);
          if (r == 0) {
            done.WaitForNotification();
          } else {
            EXPECT_TRUE(
                second->Wait(Scaled(absl::Seconds(5))).ok());  // shorter than the communicator's
            done.Notify();
          }
          EXPECT_TRUE(first->Wait(Scaled(absl::Seconds(30))).ok());
          EXPECT_TRUE(second->Wait(Scaled(absl::Seconds(30))).ok());
          EXPECT_EQ(std::count(a.begin(), a.end(), 2.0f), n);
          EXPECT_EQ(std::count(b.begin(), b.end(), 4.0f), n);
        },
        absl::Seconds(30));
  }
}

// A collective started (Work::Start, as the engine starts its prefetches) runs on the collective
// thread at once where background_start is on, though nobody waits for it and its grace is an
// hour: each rank sees its bytes counted before it waits. (Off: gloo_background_start_test.cc.)
TEST(GlooCollectivePaths, AStartedCollectiveRunsBeforeAnyoneWaits) {
  GlooOptions options;
  options.unclaimed_grace = absl::Hours(1);
  options.background_start = true;
  for (const int64_t n : {int64_t{8}, kTwoRankRingAllReduceFloats}) {
    SCOPED_TRACE(::testing::Message() << n << " floats");
    OnRanks(
        2,
        [&](int64_t r, Communicator& c) {
          std::vector<float> data(static_cast<size_t>(n), 1.0f + static_cast<float>(r));
          auto work = c.AllReduce(data.data(), n, DType::kFloat32);
          work->Start();
          const absl::Time deadline = absl::Now() + Scaled(absl::Seconds(20));
          while (c.BytesSent().count("all_reduce") == 0 && absl::Now() < deadline) {
            absl::SleepFor(absl::Milliseconds(1));
          }
          EXPECT_EQ(c.BytesSent().count("all_reduce"), 1u) << "not run within 20 s of Start";
          EXPECT_TRUE(work->Wait(Scaled(absl::Seconds(30))).ok());
          EXPECT_EQ(std::count(data.begin(), data.end(), 3.0f), n);
        },
        absl::Seconds(60), -1, options);
  }
}

// A waiter that finds its collective already running on the collective thread (it waited too late
// to run it itself) lets that thread finish it: the thread takes the communicator's lock to.
TEST(GlooCollectivePaths, AWaiterForACollectiveTheCollectiveThreadRunsDoesNotBlockIt) {
  const int64_t n = 4 * kInlineFloats;
  OnRanks(
      2,
      [&](int64_t r, Communicator& c) {
        std::vector<float> data(static_cast<size_t>(n), 1.0f);
        if (r == 1) absl::SleepFor(Scaled(absl::Seconds(1)));
        auto work = c.AllReduce(data.data(), n, DType::kFloat32);
        // Rank 0's collective thread takes it (no caller within the 5 ms grace; 300 ms, scaled,
        // leave a loaded machine room) and waits in it for rank 1.
        if (r == 0) absl::SleepFor(Scaled(absl::Milliseconds(300)));
        EXPECT_TRUE(work->Wait(Scaled(absl::Seconds(30))).ok());
        EXPECT_EQ(std::count(data.begin(), data.end(), 2.0f), n);
      },
      absl::Seconds(30));
}

}  // namespace
}  // namespace zerod::comm
