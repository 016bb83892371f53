// CollectiveLog: the running digest of a rank's collectives and the comparison through a Store
// that turns a broken SPMD order into an error naming the ranks, instead of a hang.

#include "runtime/engine/collective_log.h"

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/in_memory_store.h"

namespace zerod::engine {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Runs Compare on every rank of `logs` at once (each waits for the others' reports).
std::vector<absl::Status> CompareAll(comm::Store& store, const std::vector<CollectiveLog>& logs,
                                     const std::string& tag, absl::Duration timeout) {
  std::vector<absl::Status> out(logs.size());
  std::vector<std::thread> threads;
  const int64_t world = static_cast<int64_t>(logs.size());
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      out[static_cast<size_t>(r)] =
          logs[static_cast<size_t>(r)].Compare(store, tag, r, world, timeout);
    });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

CollectiveLog Logged(const std::function<void(CollectiveLog&)>& record) {
  CollectiveLog log;
  record(log);
  return log;
}

TEST(CollectiveLog, CountsAndNamesTheLastCollective) {
  CollectiveLog log;
  EXPECT_EQ(log.count(), 0);
  EXPECT_EQ(log.last(), "none");
  log.Record("all_gather", 16, DType::kBFloat16);
  log.Record("reduce_scatter", 8, DType::kFloat32);
  EXPECT_EQ(log.count(), 2);
  EXPECT_EQ(log.last(), "#2 reduce_scatter(fp32 x 8)");
}

TEST(CollectiveLog, TheDigestFollowsKindCountDtypeAndOrder) {
  auto two = [](absl::string_view k1, int64_t n1, DType d1, absl::string_view k2, int64_t n2,
                DType d2) {
    CollectiveLog log;
    log.Record(k1, n1, d1);
    log.Record(k2, n2, d2);
    return log.digest();
  };
  const DType bf = DType::kBFloat16, f32 = DType::kFloat32;
  const uint64_t base = two("all_gather", 16, bf, "reduce_scatter", 8, f32);
  EXPECT_EQ(base, two("all_gather", 16, bf, "reduce_scatter", 8, f32)) << "deterministic";
  const std::vector<uint64_t> changed = {
      two("all_reduce", 16, bf, "reduce_scatter", 8, f32),   // kind
      two("all_gather", 17, bf, "reduce_scatter", 8, f32),   // count
      two("all_gather", 16, f32, "reduce_scatter", 8, f32),  // dtype
      two("reduce_scatter", 8, f32, "all_gather", 16, bf),   // order
      two("all_gather", 16, bf, "reduce_scatter", 8, DType::kFloat16),
  };
  for (size_t i = 0; i < changed.size(); ++i) {
    EXPECT_NE(changed[i], base) << "change " << i;
  }
  CollectiveLog empty, one;
  one.Record("all_gather", 16, bf);
  EXPECT_NE(empty.digest(), one.digest());
  EXPECT_NE(one.digest(), base) << "a prefix differs from the whole sequence";
}

TEST(CollectiveLog, RanksThatAgreeCompareOk) {
  comm::InMemoryStore store;
  auto record = [](CollectiveLog& l) {
    l.Record("all_gather", 16, DType::kBFloat16);
    l.Record("reduce_scatter", 16, DType::kBFloat16);
  };
  const std::vector<CollectiveLog> logs = {Logged(record), Logged(record), Logged(record)};
  for (const absl::Status& s : CompareAll(store, logs, "step-1", absl::Seconds(10))) {
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(CollectiveLog, ADivergedRankIsNamedWithWhereEachStands) {
  comm::InMemoryStore store;
  auto common = [](CollectiveLog& l) { l.Record("all_gather", 16, DType::kBFloat16); };
  const std::vector<CollectiveLog> logs = {
      Logged([&](CollectiveLog& l) {
        common(l);
        l.Record("all_gather", 20, DType::kBFloat16);
      }),
      Logged([&](CollectiveLog& l) {
        common(l);
        l.Record("all_gather", 20, DType::kBFloat16);
      }),
      Logged([&](CollectiveLog& l) {
        common(l);
        l.Record("reduce_scatter", 16, DType::kBFloat16);
      }),
  };
  const std::vector<absl::Status> got = CompareAll(store, logs, "failure-2", absl::Seconds(10));
  for (size_t r = 0; r < got.size(); ++r) {
    // Every rank, the diverged one included, gets the same verdict.
    EXPECT_EQ(got[r].code(), absl::StatusCode::kFailedPrecondition) << "rank " << r;
    EXPECT_EQ(got[r].message(),
              "collective order diverged (failure-2): rank 2 at #2 reduce_scatter(bf16 x 16) vs "
              "rank 0 at #2 all_gather(bf16 x 20)")
        << "rank " << r;
  }
}

TEST(CollectiveLog, ARankThatIssuedFewerCollectivesDiverges) {
  comm::InMemoryStore store;
  const std::vector<CollectiveLog> logs = {
      Logged([](CollectiveLog& l) {
        l.Record("all_gather", 16, DType::kBFloat16);
        l.Record("all_gather", 16, DType::kBFloat16);
      }),
      Logged([](CollectiveLog& l) { l.Record("all_gather", 16, DType::kBFloat16); }),
  };
  const absl::Status s = CompareAll(store, logs, "t", absl::Seconds(10))[0];
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 at #1 all_gather(bf16 x 16)"));
}

TEST(CollectiveLog, RanksThatNeverReportAreNamedAfterTheTimeout) {
  comm::InMemoryStore store;
  CollectiveLog log;
  log.Record("all_reduce", 2, DType::kFloat32);
  // Ranks 1 and 2 of 3 are stuck elsewhere and never publish.
  const absl::Status s = log.Compare(store, "step-4", 0, 3, absl::Milliseconds(50));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("collective check step-4: ranks 1, 2 did not"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("this rank is at #1 all_reduce(fp32 x 2)"));
  // One silent rank is "rank 1", not "ranks 1".
  const absl::Status one = log.Compare(store, "step-5", 0, 2, absl::Milliseconds(50));
  EXPECT_THAT(std::string(one.message()), HasSubstr("collective check step-5: rank 1 did not"));
}

TEST(CollectiveLog, EachTagIsAFreshComparison) {
  comm::InMemoryStore store;
  std::vector<CollectiveLog> logs(2);
  for (CollectiveLog& l : logs) l.Record("all_gather", 4, DType::kFloat32);
  for (const absl::Status& s : CompareAll(store, logs, "step-1", absl::Seconds(10))) {
    ASSERT_TRUE(s.ok()) << s;
  }
  // Rank 1 goes astray afterwards: a later tag must see it, not step-1's matching reports.
  logs[0].Record("all_gather", 4, DType::kFloat32);
  logs[1].Record("reduce_scatter", 4, DType::kFloat32);
  for (const absl::Status& s : CompareAll(store, logs, "step-2", absl::Seconds(10))) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr("step-1")));
  }
}

}  // namespace
}  // namespace zerod::engine
