#include "runtime/comm/gloo/host_ranks.h"

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/in_memory_store.h"

namespace zerod::comm::internal {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<int64_t> CountOnRanks(const std::vector<std::string>& hostnames) {
  InMemoryStore store;
  const int64_t world = static_cast<int64_t>(hostnames.size());
  std::vector<int64_t> counts(hostnames.size(), -1);
  std::vector<std::thread> ranks;
  for (int64_t r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      absl::StatusOr<int64_t> n = RanksSharingHost(
          store, "hosts/", world, hostnames[static_cast<size_t>(r)], absl::Seconds(20));
      ASSERT_TRUE(n.ok()) << n.status();
      counts[static_cast<size_t>(r)] = *n;
    });
  }
  for (std::thread& t : ranks) t.join();
  return counts;
}

TEST(RanksSharingHost, CountsTheRanksThatGaveTheSameAddress) {
  EXPECT_THAT(CountOnRanks({"10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.1"}),
              ElementsAre(3, 1, 3, 3));
  EXPECT_THAT(CountOnRanks({"127.0.0.1", "127.0.0.1"}), ElementsAre(2, 2));
  EXPECT_THAT(CountOnRanks({"a", "b", "c"}), ElementsAre(1, 1, 1));
}

TEST(RanksSharingHost, OneRankNeedsNoStore) {
  InMemoryStore store;
  absl::StatusOr<int64_t> n = RanksSharingHost(store, "hosts/", 1, "x", absl::ZeroDuration());
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1);
}

TEST(RanksSharingHost, RanksThatNeverComeAreCountedAfterTheTimeout) {
  InMemoryStore store;
  absl::StatusOr<int64_t> n = RanksSharingHost(store, "hosts/", 3, "x", absl::Milliseconds(200));
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(n.status().message(), HasSubstr("1 of 3 ranks gave the address"));
}

// Addresses of any length and characters make keys of their own, short and the same on every rank.
TEST(RanksSharingHost, AnAddressOfAnyCharactersKeysItsOwnCounter) {
  const std::string odd(300, '/');
  EXPECT_THAT(CountOnRanks({odd, "fe80::1%eth0", odd, "fe80::1%eth0", odd}),
              ElementsAre(3, 2, 3, 2, 3));
}

}  // namespace
}  // namespace zerod::comm::internal
