// Limits of the real zerod binary, through real clients: a join that declares a huge world costs
// what joined, every cap refuses with the flag named and keeps what is stored, oversized reports
// are not kept, and joins that come to nothing leave no job behind.

#include <grpcpp/grpcpp.h>

#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "client/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/auth_metadata.h"
#include "proto/plan_convert.h"
#include "runtime/plan/digest.h"
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
    joined = zerod.Client()->Join(JoinOf("huge", kWorld, 0), Scaled(absl::Seconds(120))).status();
  });
  // The join waits for the others; once DescribeJob lists it, the daemon has taken it in.
  absl::StatusOr<v1::JobDescription> d;
  Eventually(
      [&] {
        d = client->DescribeJob("huge");
        return d.ok() && d->members_size() == 1;
      },
      absl::Seconds(60));
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
  Eventually(
      [&] {
        listed = ListedJobs(zerod);
        return listed.empty();
      },
      absl::Seconds(10));
  EXPECT_TRUE(listed.empty()) << listed.front();
  // Nor after a restart.
  ASSERT_EQ(zerod.Terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  EXPECT_TRUE(ListedJobs(zerod).empty());
}

TEST(Limits, AHeartbeatCarryingAMillionEntriesIsRefusedAndNotKept) {
  // Tens of megabytes to send and parse: on a loaded machine that took more than a minute, longer
  // than the call's usual 10 s and than a lease the member (heard from only at its join) kept.
  ZerodHarness zerod({"--lease-ttl", "1h"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client(Scaled(absl::Seconds(10)), Scaled(absl::Seconds(300)));
  auto m = client->Join(JoinOf("beat", 1, 0), Scaled(absl::Seconds(30)));
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
  const auto kept = client->Heartbeat("beat", 0, m->generation, usual);
  EXPECT_TRUE(kept.ok()) << kept.status();
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
  expect_refused(client->Join(JoinOf("wide", 9, 0), Scaled(absl::Seconds(5))).status(),
                 absl::StatusCode::kInvalidArgument, "--max-world-size");
  expect_refused(client->Join(JoinOf("a-long-job-id-x17", 1, 0), Scaled(absl::Seconds(5))).status(),
                 absl::StatusCode::kInvalidArgument, "--max-job-id-bytes");
  ASSERT_TRUE(client->Join(JoinOf("keys", 1, 0), Scaled(absl::Seconds(30))).ok());
  ASSERT_TRUE(client->Join(JoinOf("bytes", 1, 0), Scaled(absl::Seconds(30))).ok());
  expect_refused(client->Join(JoinOf("third", 1, 0), Scaled(absl::Seconds(5))).status(),
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

// Refusals that unit tests checked in the store and in admission, checked again through the real
// daemon: each is refused with the value at fault named, and nothing stored changes.
TEST(Limits, AnAddPastInt64BadPlanOptionsAndAnOversizedCompareSetAreRefusedAndChangeNothing) {
  ZerodHarness zerod({"--max-value", "1KiB"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  ASSERT_TRUE(client->Join(JoinOf("bounds", 1, 0), Scaled(absl::Seconds(30))).ok());

  // Add wrapping past int64 would hand out a counter value already given.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  ASSERT_EQ(*client->StoreAdd("bounds", "counter", kMax), kMax);
  const absl::StatusOr<int64_t> wrapped = client->StoreAdd("bounds", "counter", 1);
  EXPECT_EQ(wrapped.status().code(), absl::StatusCode::kOutOfRange) << wrapped.status();
  EXPECT_THAT(std::string(wrapped.status().message()),
              HasSubstr("key 'counter': adding 1 would overflow a 64-bit integer"));
  EXPECT_EQ(*client->StoreGet("bounds", "counter", {}), std::to_string(kMax));
  ASSERT_EQ(*client->StoreAdd("bounds", "low", -1), -1);
  EXPECT_EQ(client->StoreAdd("bounds", "low", std::numeric_limits<int64_t>::min()).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*client->StoreGet("bounds", "low", {}), "-1");

  // CompareSet is held to --max-value like Set, whether it replaces or creates.
  ASSERT_TRUE(client->StoreSet("bounds", "small", "v").ok());
  for (const std::optional<std::string>& expected :
       {std::optional<std::string>("v"), std::optional<std::string>()}) {
    const std::string key = expected ? "small" : "absent";
    const auto cas = client->StoreCompareSet("bounds", key, expected, std::string(2048, 'x'));
    EXPECT_EQ(cas.status().code(), absl::StatusCode::kResourceExhausted) << cas.status();
    EXPECT_THAT(std::string(cas.status().message()),
                HasSubstr("value for key '" + key +
                          "' is 2048 bytes, over the limit of 1024 "
                          "(--max-value)"));
  }
  EXPECT_EQ(*client->StoreGet("bounds", "small", {}), "v");
  EXPECT_EQ(client->StoreGet("bounds", "absent", {}).status().code(), absl::StatusCode::kNotFound);

  // Plan options no plan means, through the SDK where it can carry them...
  struct Bad {
    std::string job;
    std::function<void(client::JoinOptions&)> set;
    std::string expected;
  };
  const std::vector<Bad> bad = {
      {"neg-align", [](client::JoinOptions& o) { o.plan_options.partition_alignment_numel = -16; },
       "plan options: partition_alignment_numel must be 0 (the default) or positive, got -16"},
      {"neg-bucket", [](client::JoinOptions& o) { o.plan_options.reduce_bucket_bytes = -1; },
       "plan options: reduce_bucket_bytes must be 0 (the default) or positive, got -1"},
      {"neg-budget", [](client::JoinOptions& o) { o.budget_bytes = -1; },
       "budget must be 0 (unbounded) or positive, got -1"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.job);
    client::JoinOptions join = JoinOf(b.job, 1, 0);
    b.set(join);
    const absl::Status s = client->Join(join, Scaled(absl::Seconds(5))).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(b.expected));
  }
  // ...and as raw bytes where it cannot: a dtype no version defines.
  {
    const client::JoinOptions o = JoinOf("dtype-99", 1, 0);
    v1::JoinRequest request;
    request.set_job_id(o.job_id);
    request.set_world_size(1);
    request.set_rank(0);
    request.set_host(o.host);
    request.set_device(o.device);
    rpc::ToProto(o.layout, request.mutable_layout());
    request.set_layout_digest(plan::DigestHex(plan::LayoutDigest(o.layout)));
    request.mutable_options()->set_param_dtype(static_cast<v1::DType>(99));
    auto stub = v1::Coordinator::NewStub(
        grpc::CreateChannel(zerod.endpoint(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.AddMetadata(rpc::kJobTokenMetadata, client::NewToken());
    context.set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(30))));
    v1::JoinResponse response;
    const grpc::Status s = stub->Join(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("plan options: param_dtype 99 is unknown"));
  }
  // None of the refused joins left a job, and the store is as it was.
  EXPECT_EQ(ListedJobs(zerod), (std::vector<std::string>{"bounds"}));
  EXPECT_EQ(*client->StoreGet("bounds", "counter", {}), std::to_string(kMax));
}

TEST(Limits, ALimitOutOfRangeIsAUsageError) {
  ZerodHarness zerod;
  const ProcessResult r = zerod.StartRefused({"--max-world-size", "0"}, absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.out, HasSubstr("--max-world-size: expected 1..16777216, got 0"));
  ZerodHarness other;
  const ProcessResult ops = other.StartRefused({"--etcd-max-txn-ops", "0"}, absl::Seconds(30));
  EXPECT_EQ(ops.exit_code, 2);
  EXPECT_THAT(ops.out, HasSubstr("--etcd-max-txn-ops: expected 1..1073741824, got 0"));
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
