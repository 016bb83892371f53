// Limits of the real zerod binary, through real clients: a join that declares a huge world costs
// what joined, every cap refuses with the flag named and keeps what is stored, oversized reports
// are not kept, and joins that come to nothing leave no job behind.

#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/synthetic_layout.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

client::JoinOptions JoinOf(const std::string& job, int64_t world, int64_t rank) {
  client::JoinOptions o;
  o.job_id = job;
  o.world_size = world;
  o.rank = rank;
  o.host = "test-host";
  o.device = "cpu:" + std::to_string(rank);
  o.layout = plan::SyntheticLayout(1 << 16, DType::kBFloat16, 4);
  o.plan_options.stage = 2;
  return o;
}

// The resident memory of process `pid`, in bytes (VmRSS of /proc/PID/status).
int64_t ResidentBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    int64_t kib = 0;
    fields >> kib;
    return kib << 10;
  }
  ADD_FAILURE() << "no VmRSS for process " << pid;
  return 0;
}

// Job ids `zeroctl jobs --json` lists.
std::vector<std::string> ListedJobs(ZerodHarness& zerod) {
  const ProcessResult r = zerod.Zeroctl({"jobs", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> ids;
  if (r.exit_code != 0) return ids;
  const json listed = json::parse(r.out);
  for (const json& j : listed["jobs"]) ids.push_back(j["job_id"]);
  return ids;
}

TEST(Limits, AJoinDeclaring2To24RanksCostsTheDaemonWhatOneMemberCosts) {
  ZerodHarness zerod({"--max-world-size", "16777216"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  const int64_t before = ResidentBytes(zerod.daemon_pid());
  constexpr int64_t kWorld = int64_t{1} << 24;
  absl::Status joined;
  std::thread joiner([&] {
    joined = zerod.Client()->Join(JoinOf("huge", kWorld, 0), absl::Seconds(120)).status();
  });
  // The join waits for the others; once DescribeJob lists it, the daemon has taken it in.
  absl::StatusOr<v1::JobDescription> d;
  for (int i = 0; i < 600; ++i) {
    d = client->DescribeJob("huge");
    if (d.ok() && d->members_size() == 1) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->members_size(), 1);
  EXPECT_EQ(d->summary().world_size(), kWorld);
  const int64_t after = ResidentBytes(zerod.daemon_pid());
  std::cout << "zerod VmRSS before the 2^24-rank join " << (before >> 20) << " MiB, after "
            << (after >> 20) << " MiB\n";
  RecordProperty("rss_before_mib", static_cast<int>(before >> 20));
  RecordProperty("rss_after_mib", static_cast<int>(after >> 20));
  EXPECT_LT(after - before, int64_t{200} << 20);
  // Inspection lists the one member and the count, not the world.
  const ProcessResult members = zerod.Zeroctl({"members", "huge", "--json"});
  ASSERT_EQ(members.exit_code, 0) << members.err;
  EXPECT_EQ(json::parse(members.out)["members"].size(), 1u);
  EXPECT_THAT(zerod.Zeroctl({"jobs"}).out, HasSubstr("huge"));
  // Its rank leaves: the job never formed and nobody is in it, so it is gone.
  ASSERT_TRUE(client->Leave("huge", 0).ok());
  joiner.join();
  EXPECT_EQ(joined.code(), absl::StatusCode::kCancelled) << joined;
  EXPECT_TRUE(ListedJobs(zerod).empty());
}

TEST(Limits, JoinsThatComeToNothingLeaveNoJobBehind) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  // Refused at formation: the plan does not fit the budget.
  auto poor = zerod.StartRank({"--job", "poor", "--world", "1", "--budget", "1000"});
  const json refused = zerod.Finish(*poor);
  EXPECT_EQ(refused["error_code"], static_cast<int>(absl::StatusCode::kResourceExhausted))
      << refused.dump();
  EXPECT_TRUE(ListedJobs(zerod).empty());
  // Timed out alone.
  auto client = zerod.Client();
  const absl::Status alone = client->Join(JoinOf("alone", 2, 0), absl::Milliseconds(1500)).status();
  EXPECT_EQ(alone.code(), absl::StatusCode::kDeadlineExceeded) << alone;
  // The daemon answers a little before the client's deadline; its own timer may be later still.
  std::vector<std::string> listed;
  for (int i = 0; i < 100; ++i) {
    listed = ListedJobs(zerod);
    if (listed.empty()) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(listed.empty()) << listed.front();
  // Nor after a restart.
  ASSERT_EQ(zerod.Terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  EXPECT_TRUE(ListedJobs(zerod).empty());
}

TEST(Limits, AHeartbeatCarryingAMillionEntriesIsRefusedAndNotKept) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  auto m = client->Join(JoinOf("beat", 1, 0), absl::Seconds(30));
  ASSERT_TRUE(m.ok()) << m.status();
  client::HeartbeatReport flood;
  for (int i = 0; i < 1000000; ++i) flood.comm_bytes["c" + std::to_string(i)] = i;
  auto refused = client->Heartbeat("beat", 0, m->generation, flood);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("1000000 entries, over 64"));
  const ProcessResult members = zerod.Zeroctl({"members", "beat", "--json"});
  ASSERT_EQ(members.exit_code, 0) << members.err;
  EXPECT_LT(members.out.size(), 4096u);
  // A report of the usual size is kept.
  client::HeartbeatReport usual;
  usual.memory_bytes["params"] = 1 << 20;
  ASSERT_TRUE(client->Heartbeat("beat", 0, m->generation, usual).ok());
}

TEST(Limits, EachCapRefusesWithItsFlagNamedAndKeepsWhatIsStored) {
  ZerodHarness zerod({"--max-world-size", "8", "--max-jobs", "2", "--max-job-id-bytes", "16",
                      "--max-key-bytes", "32", "--max-store-keys", "4", "--max-store-bytes",
                      "1KiB"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  auto expect_refused = [](const absl::Status& s, absl::StatusCode code, const std::string& flag) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(flag));
  };
  expect_refused(client->Join(JoinOf("wide", 9, 0), absl::Seconds(5)).status(),
                 absl::StatusCode::kInvalidArgument, "--max-world-size");
  expect_refused(client->Join(JoinOf("a-long-job-id-x17", 1, 0), absl::Seconds(5)).status(),
                 absl::StatusCode::kInvalidArgument, "--max-job-id-bytes");
  ASSERT_TRUE(client->Join(JoinOf("keys", 1, 0), absl::Seconds(30)).ok());
  ASSERT_TRUE(client->Join(JoinOf("bytes", 1, 0), absl::Seconds(30)).ok());
  expect_refused(client->Join(JoinOf("third", 1, 0), absl::Seconds(5)).status(),
                 absl::StatusCode::kResourceExhausted, "--max-jobs 2");
  EXPECT_EQ(ListedJobs(zerod), (std::vector<std::string>{"bytes", "keys"}));

  // Keys per job: every call that writes one is checked, and what is stored stays.
  expect_refused(client->StoreSet("keys", std::string(33, 'k'), "v"),
                 absl::StatusCode::kInvalidArgument, "--max-key-bytes");
  for (const std::string k : {"k0", "k1", "k2"}) ASSERT_TRUE(client->StoreSet("keys", k, k).ok());
  ASSERT_TRUE(client->StoreAdd("keys", "counter", 5).ok());
  expect_refused(client->StoreSet("keys", "k4", "v"), absl::StatusCode::kResourceExhausted,
                 "--max-store-keys");
  expect_refused(client->StoreCompareSet("keys", "k4", std::nullopt, "v").status(),
                 absl::StatusCode::kResourceExhausted, "--max-store-keys");
  expect_refused(client->StoreAdd("keys", "k4", 1).status(), absl::StatusCode::kResourceExhausted,
                 "--max-store-keys");
  for (const std::string k : {"k0", "k1", "k2"}) EXPECT_EQ(*client->StoreGet("keys", k, {}), k);
  EXPECT_EQ(*client->StoreAdd("keys", "counter", 1), 6);
  EXPECT_EQ(client->StoreGet("keys", "k4", {}).status().code(), absl::StatusCode::kNotFound);

  // Bytes per job (keys and values).
  ASSERT_TRUE(client->StoreSet("bytes", "big", std::string(900, 'x')).ok());
  expect_refused(client->StoreSet("bytes", "more", std::string(200, 'y')),
                 absl::StatusCode::kResourceExhausted, "--max-store-bytes");
  expect_refused(
      client->StoreCompareSet("bytes", "more", std::nullopt, std::string(200, 'y')).status(),
      absl::StatusCode::kResourceExhausted, "--max-store-bytes");
  EXPECT_EQ(client->StoreGet("bytes", "big", {})->size(), 900u);
  ASSERT_TRUE(*client->StoreDelete("bytes", "big"));
  EXPECT_TRUE(client->StoreSet("bytes", "more", std::string(200, 'y')).ok());
}

TEST(Limits, ALimitOutOfRangeIsAUsageError) {
  ZerodHarness zerod;
  const ProcessResult r = zerod.StartRefused({"--max-world-size", "0"}, absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("--max-world-size: expected 1..16777216, got 0"));
}

// A lease that never runs out would never release a survivor (found by fuzzing the duration
// strings: "inf" parses).
TEST(Limits, ALeaseThatNeverRunsOutIsAUsageError) {
  for (const char* ttl : {"inf", "25h", "0s"}) {
    ZerodHarness zerod;
    const ProcessResult r = zerod.StartRefused({"--lease-ttl", ttl}, absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 2) << ttl;
    EXPECT_THAT(r.out, HasSubstr("--lease-ttl: expected a positive duration up to 24h")) << ttl;
  }
}

}  // namespace
}  // namespace zerod::testing
