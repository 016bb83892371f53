// The real zerod binary with real client processes: formation, blocking store reads across
// processes, leases, crash and restart, bad input, zeroctl, and shutdown.

#include <signal.h>
#include <sys/stat.h>

#include <set>
#include <thread>

#include "absl/time/clock.h"
#include "client/coordinator_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/prefix_store.h"
#include "runtime/plan/synthetic_layout.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

client::JoinOptions JoinOf(const std::string& job, int64_t world, int64_t rank,
                           int64_t params = 1 << 20) {
  client::JoinOptions o;
  o.job_id = job;
  o.world_size = world;
  o.rank = rank;
  o.host = "test-host";
  o.device = "cpu:" + std::to_string(rank);
  o.layout = plan::SyntheticLayout(params, DType::kBFloat16, 8);
  o.plan_options.stage = 2;
  return o;
}

TEST(Zerod, AJobOfFourProcessesFormsAndEveryRankGetsTheSamePlan) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int i = 0; i < 4; ++i) {
    ranks.push_back(zerod.StartRank({"--job", "four", "--world", "4", "--stage", "3",
                                     "--heartbeat-ms", "50", "--run-ms", "300"}));
  }
  std::set<int64_t> seen_ranks;
  std::set<std::string> digests;
  for (auto& r : ranks) {
    const json out = zerod.Finish(*r);
    ASSERT_TRUE(out.contains("rank")) << out.dump();
    seen_ranks.insert(out["rank"].get<int64_t>());
    digests.insert(out["plan_digest"].get<std::string>());
    EXPECT_EQ(out["generation"], 1);
    EXPECT_EQ(out["stage"], 3);
    EXPECT_EQ(out["heartbeat_failures"], 0);
  }
  EXPECT_EQ(seen_ranks, (std::set<int64_t>{0, 1, 2, 3}));
  ASSERT_EQ(digests.size(), 1u);
  const ProcessResult shards = zerod.Zeroctl({"shards", "four", "--json"});
  ASSERT_EQ(shards.exit_code, 0) << shards.err;
  EXPECT_EQ(json::parse(shards.out)["plan_digest"], *digests.begin());
}

TEST(Zerod, BlockingGetWaitsForAnotherProcessToSet) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto reader = zerod.StartRank({"--job", "kv", "--world", "2", "--rank", "0", "--get", "nccl_id",
                                 "--timeout-ms", ScaledMs(absl::Seconds(20))});
  auto writer = zerod.StartRank(
      {"--job", "kv", "--world", "2", "--rank", "1", "--run-ms", "0", "--set", "nccl_id=abc123"});
  const json w = zerod.Finish(*writer);
  const json r = zerod.Finish(*reader);
  EXPECT_EQ(r["value"], "abc123") << r.dump() << w.dump();
  // A key nobody sets times out with a message naming it.
  auto client = zerod.Client();
  auto missing = client->StoreGet("kv", "never", absl::Milliseconds(200));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'never'"));
}

TEST(Zerod, StoreOperationsAndBarrier) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  auto joined = client->Join(JoinOf("ops", 1, 0), Scaled(absl::Seconds(10)));
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_EQ(*client->StoreAdd("ops", "n", 3), 3);
  EXPECT_EQ(*client->StoreAdd("ops", "n", 4), 7);
  auto cas = client->StoreCompareSet("ops", "leader", std::nullopt, "rank0");
  EXPECT_TRUE(cas->swapped());
  cas = client->StoreCompareSet("ops", "leader", std::nullopt, "rank1");
  EXPECT_FALSE(cas->swapped());
  EXPECT_EQ(cas->value(), "rank0");
  EXPECT_TRUE(*client->StoreDelete("ops", "leader"));
  EXPECT_TRUE(client->StoreWait("ops", {"n"}, absl::Milliseconds(100)).ok());
  EXPECT_EQ(client->StoreWait("ops", {"n", "absent"}, absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
  // Three participants reach a barrier from three threads.
  std::vector<std::thread> threads;
  std::atomic<int> passed{0};
  for (int p = 0; p < 3; ++p) {
    threads.emplace_back([&, p] {
      if (client->Barrier("ops", "step1", p, 3, Scaled(absl::Seconds(10))).ok()) ++passed;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(passed, 3);
  EXPECT_EQ(client->Barrier("ops", "lonely", 0, 2, absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(Zerod, TheRuntimeStoreInterfaceWorksOverTheDaemon) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  std::shared_ptr<client::CoordinatorClient> client = zerod.Client();
  ASSERT_TRUE(client->Join(JoinOf("rdzv", 1, 0), Scaled(absl::Seconds(10))).ok());
  auto store = std::make_shared<client::CoordinatorStore>(client, "rdzv");
  comm::PrefixStore generation("gen1", store);
  comm::Store& s = generation;
  ASSERT_TRUE(s.Set("nccl_id", std::string("\x01\x00id", 4)).ok());
  EXPECT_EQ(*s.Get("nccl_id", absl::Seconds(1)), std::string("\x01\x00id", 4));
  EXPECT_EQ(*client->StoreGet("rdzv", "gen1/nccl_id", absl::ZeroDuration()),
            std::string("\x01\x00id", 4));
  EXPECT_EQ(*s.Add("arrived", 1), 1);
  EXPECT_EQ(*s.CompareSet("owner", std::nullopt, "r0"), "r0");
  EXPECT_EQ(*s.CompareSet("owner", std::nullopt, "r1"), "r0");
  EXPECT_TRUE(*s.Delete("owner"));
  EXPECT_TRUE(s.Wait({"nccl_id", "arrived"}, absl::Seconds(1)).ok());
  std::thread late([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(s.Set("late", "v").ok());
  });
  EXPECT_EQ(*s.Get("late", Scaled(absl::Seconds(10))), "v");
  late.join();
  EXPECT_EQ(s.Get("absent", absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(Zerod, AnExpiredLeaseMarksTheRankLostAndEveryWatcherIsTold) {
  // A lease of 1 s (scaled): long enough that rank 0's heartbeats (every 50 ms) keep it on a
  // loaded machine, short enough that rank 1 is lost while the watch below is open. Rank 0
  // outlives the lease of rank 1 twice over, and its own lapses one lease after it ends: both
  // scale alike.
  ZerodHarness zerod({"--lease-ttl", ScaledFlag(absl::Seconds(1)), "--restart-grace", "0s"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  // Rank 0 heartbeats for 3 leases; rank 1 joins and exits without a word.
  auto alive = zerod.StartRank({"--job", "lease", "--world", "2", "--rank", "0", "--heartbeat-ms",
                                "50", "--run-ms", ScaledMs(absl::Seconds(3))});
  auto silent = zerod.StartRank({"--job", "lease", "--world", "2", "--rank", "1"});
  EXPECT_EQ(zerod.Finish(*silent)["rank"], 1);
  auto client = zerod.Client();
  std::vector<v1::JobEvent> events;
  const absl::Time start = absl::Now();
  absl::Status watched = client->Watch("lease", [&](const v1::JobEvent& e) {
    events.push_back(e);
    return e.kind() != v1::JobEvent::MEMBER_LOST && absl::Now() - start < Scaled(absl::Seconds(10));
  });
  ASSERT_TRUE(watched.ok()) << watched;
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().kind(), v1::JobEvent::MEMBER_LOST);
  EXPECT_EQ(events.back().rank(), 1);
  EXPECT_EQ(events.back().generation(), 2);
  const ProcessResult members = zerod.Zeroctl({"members", "lease", "--json"});
  ASSERT_EQ(members.exit_code, 0) << members.err;
  const json m = json::parse(members.out);
  EXPECT_EQ(m["generation"], 2);
  EXPECT_EQ(m["members"][0]["rank"], 0);
  EXPECT_EQ(m["members"][0]["state"], "active");
  EXPECT_EQ(m["members"][1]["state"], "lost");
  const json rank0 = zerod.Finish(*alive);
  EXPECT_EQ(rank0["heartbeat_failures"], 0) << rank0.dump();
}

TEST(Zerod, KillNineAndRestartKeepsJobsPlansAndStoreKeysAndClientsRideThrough) {
  ZerodHarness zerod({"--restart-grace", "30s"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  // Rank 0 keeps heartbeating across the crash (and the restart, slower in a slower build); rank 1
  // stores a key and exits.
  auto steady = zerod.StartRank({"--job", "durable", "--world", "2", "--rank", "0",
                                 "--heartbeat-ms", "100", "--run-ms", ScaledMs(absl::Seconds(4))});
  auto setter = zerod.StartRank(
      {"--job", "durable", "--world", "2", "--rank", "1", "--set", "gloo/addr=10.0.0.1:99"});
  const json set = zerod.Finish(*setter);
  const std::string digest = set["plan_digest"];
  absl::SleepFor(absl::Milliseconds(500));
  zerod.Crash();
  absl::SleepFor(absl::Milliseconds(700));  // heartbeats fail and retry meanwhile
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  const int64_t restarted_ms = absl::ToUnixMillis(absl::Now());
  auto client = zerod.Client();
  auto plan = client->GetPlan("durable");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->plan_digest(), digest);
  EXPECT_EQ(*client->StoreGet("durable", "gloo/addr", absl::ZeroDuration()), "10.0.0.1:99");
  auto d = client->DescribeJob("durable");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->summary().state(), v1::JOB_RUNNING);
  EXPECT_EQ(d->members_size(), 2);
  const json rank0 = zerod.Finish(*steady);
  EXPECT_EQ(rank0["heartbeat_failures"], 0)
      << "heartbeats ride through the restart: " << rank0.dump();
  // The restarted daemon heard from rank 0, which kept its slot.
  d = client->DescribeJob("durable");
  EXPECT_EQ(d->members(0).state(), v1::MEMBER_ACTIVE);
  EXPECT_GT(d->members(0).last_heartbeat_unix_ms(), restarted_ms);
  EXPECT_THAT(zerod.Log(), HasSubstr("1 job(s) recovered"));
}

TEST(Zerod, BadInputGetsAPreciseStatusAndHarmsNothing) {
  ZerodHarness zerod({"--max-message", "1MiB"});
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client(absl::Seconds(2));
  // Rank 0 waits in a join while the others are refused.
  std::thread rank0([&] {
    auto m = client->Join(JoinOf("bad", 2, 0), Scaled(absl::Seconds(30)));
    EXPECT_TRUE(m.ok()) << m.status();
  });
  // The refusals below compare against rank 0: wait until the daemon has it (a loaded or
  // sanitized machine may take a while).
  Eventually(
      [&] {
        auto job = client->DescribeJob("bad");
        return job.ok() && job->members_size() > 0;
      },
      absl::Seconds(20));
  auto mismatch = client->Join(JoinOf("bad", 2, 1, 1 << 21), absl::Seconds(5));
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(mismatch.status().message()), HasSubstr("differs from rank 0"));
  EXPECT_EQ(client->Join(JoinOf("bad", 2, 7), absl::Seconds(5)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto taken = JoinOf("bad", 2, 0);
  taken.host = "other-host";
  EXPECT_EQ(client->Join(taken, absl::Seconds(5)).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto world = client->Join(JoinOf("bad", 3, 1), absl::Seconds(5));
  EXPECT_EQ(world.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(world.status().message()), HasSubstr("world size 2"));
  EXPECT_EQ(client->GetPlan("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->StoreSet("nope", "k", "v").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->StoreSet("bad", "big", std::string(2 << 20, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
  // Nothing was harmed: rank 1 joins properly and the job forms.
  auto rank1 = client->Join(JoinOf("bad", 2, 1), Scaled(absl::Seconds(10)));
  EXPECT_TRUE(rank1.ok()) << rank1.status();
  rank0.join();
  // A budget no stage meets: RESOURCE_EXHAUSTED that says what would fit.
  auto poor = JoinOf("poor", 1, 0);
  poor.budget_bytes = 1000;
  auto refused = client->Join(poor, absl::Seconds(5));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("stage"));
}

TEST(Zerod, ZeroctlShowsALiveJob) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto ranks = std::vector<std::unique_ptr<ChildProcess>>();
  for (int i = 0; i < 2; ++i) {
    ranks.push_back(zerod.StartRank(
        {"--job", "live", "--world", "2", "--heartbeat-ms", "50", "--run-ms", "1500"}));
  }
  auto client = zerod.Client();
  // Wait until both heartbeat with their memory.
  Eventually(
      [&] {
        auto d = client->DescribeJob("live");
        return d.ok() && d->members_size() == 2 && !d->members(0).memory_bytes().empty() &&
               !d->members(1).memory_bytes().empty();
      },
      absl::Seconds(10));
  ProcessResult r = zerod.Zeroctl({"jobs"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("live"));
  EXPECT_THAT(r.out, HasSubstr("running"));
  r = zerod.Zeroctl({"jobs", "--json"});
  EXPECT_EQ(json::parse(r.out)["jobs"][0]["job_id"], "live");
  r = zerod.Zeroctl({"members", "live"});
  EXPECT_THAT(r.out, HasSubstr("active"));
  r = zerod.Zeroctl({"shards", "live", "--rank", "1", "--tensor", "param.3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("plan digest"));
  EXPECT_THAT(r.out, HasSubstr("tensor param.3"));
  r = zerod.Zeroctl({"shards", "live", "--json", "--tensor", "param.3"});
  const json shards = json::parse(r.out);
  EXPECT_EQ(shards["ranks"].size(), 2u);
  int64_t covered = 0;
  for (const json& p : shards["pieces"]) covered += p["numel"].get<int64_t>();
  EXPECT_EQ(covered, (1 << 20) / 8);
  r = zerod.Zeroctl({"memory", "live", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json memory = json::parse(r.out);
  for (const json& rank : memory["ranks"]) {
    // The ranks report exactly the plan's figures (join_client sends MemoryForRank).
    EXPECT_EQ(rank["plan"], rank["reported"]) << rank.dump();
    EXPECT_EQ(rank["plan_total_bytes"], memory["allocated_bytes_per_rank"]);
  }
  r = zerod.Zeroctl({"memory", "live"});
  EXPECT_THAT(r.out, HasSubstr("REPORTED"));
  // Errors: unknown job is a server error (1); a bad flag is a usage error (2).
  r = zerod.Zeroctl({"members", "ghost"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("job ghost not found"));
  r = zerod.Zeroctl({"shards", "live", "--rank", "x"});
  EXPECT_EQ(r.exit_code, 2);
  for (auto& rank : ranks) zerod.Finish(*rank);
}

TEST(Zerod, ZeroctlTakesGlobalFlagsBeforeTheCommand) {
  ZerodHarness zerod({"--lease-ttl", "1h"});  // the silent member below must not lapse mid-test
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  // One member that never heartbeats: nothing changes between the calls compared below.
  ASSERT_TRUE(client->Join(JoinOf("g", 1, 0), Scaled(absl::Seconds(10))).ok());
  struct Command {
    std::vector<std::string> args;
    const char* shows;  // in text and JSON alike
  };
  const Command commands[] = {{{"jobs"}, "g"},
                              {{"members", "g"}, "test-host"},
                              {{"shards", "g", "--rank", "0"}, "plan"},
                              {{"memory", "g"}, "plan"}};
  for (const Command& c : commands) {
    for (const bool as_json : {false, true}) {
      std::vector<std::string> global = {Built(ZEROCTL_PATH), "--endpoint", zerod.endpoint(),
                                         "--timeout", ScaledFlag(absl::Seconds(5))};
      if (as_json) global.push_back("--json");
      global.insert(global.end(), c.args.begin(), c.args.end());
      std::vector<std::string> local = c.args;
      if (as_json) local.push_back("--json");
      const ProcessResult before = RunProcess(global);
      const ProcessResult after = zerod.Zeroctl(local);
      const std::string name = c.args[0] + (as_json ? " --json" : "");
      ASSERT_EQ(before.exit_code, 0) << name << ": " << before.err;
      ASSERT_EQ(after.exit_code, 0) << name << ": " << after.err;
      EXPECT_THAT(before.out, HasSubstr(c.shows)) << name;
      if (as_json) {
        EXPECT_EQ(json::parse(before.out), json::parse(after.out)) << name;
      } else if (c.args[0] != "members") {  // members prints "last heartbeat N s ago"
        EXPECT_EQ(before.out, after.out) << name;
      }
    }
  }
  const ProcessResult typo =
      RunProcess({Built(ZEROCTL_PATH), "--endpoint", zerod.endpoint(), "memebrs", "g"});
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_EQ(typo.err,
            "zeroctl: unknown command 'memebrs' (expected one of: plan, jobs, members, shards, "
            "memory, watch, checkpoints, end, checkpoint)\n");
}

TEST(Zerod, ZeroctlWatchStreamsEventsUntilTheJobEnds) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto client = zerod.Client();
  ASSERT_TRUE(client->Join(JoinOf("w", 1, 0), Scaled(absl::Seconds(10))).ok());
  ChildProcess watch({ZEROCTL_PATH, "watch", "w", "--json", "--endpoint", zerod.endpoint()},
                     zerod.dir().path() + "/watch.log");
  // The step must happen while the watch is open: wait for its first event (no fixed delay is
  // enough on a loaded sanitizer run).
  Eventually([&] { return watch.Output().find("\"kind\":\"snapshot\"") != std::string::npos; },
             absl::Seconds(30));
  client::HeartbeatReport report;
  report.step = 5;
  ASSERT_TRUE(client->Heartbeat("w", 0, 1, report).ok());
  ASSERT_TRUE(client->EndJob("w").ok());
  EXPECT_EQ(watch.Wait(absl::Seconds(10)), 0) << watch.Output();
  const std::string out = watch.Output();
  EXPECT_THAT(out, HasSubstr("\"kind\":\"snapshot\""));
  EXPECT_THAT(out, HasSubstr("\"kind\":\"step\""));
  EXPECT_THAT(out, HasSubstr("\"kind\":\"job_ended\""));
}

TEST(Zerod, NoEndpointIsAUsageError) {
  const ProcessResult r = RunProcess({ZEROCTL_PATH, "jobs"});
  if (std::getenv("ZEROD_ENDPOINT") != nullptr) GTEST_SKIP() << "ZEROD_ENDPOINT is set";
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("ZEROD_ENDPOINT"));
}

TEST(Zerod, SigtermDrainsAndExitsZero) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  auto waiting = zerod.StartRank({"--job", "drain", "--world", "2", "--rank", "0"});
  // A join waiting in the daemon when it is told to stop.
  auto client = zerod.Client();
  Eventually([&] { return client->DescribeJob("drain").ok(); }, absl::Seconds(20));
  EXPECT_EQ(zerod.Terminate(), 0) << zerod.Log();
  EXPECT_THAT(zerod.Log(), HasSubstr("stopped"));
  waiting->Signal(SIGKILL);  // it would retry its join until a daemon comes back
}

TEST(Zerod, OneDaemonPerDataDirAndPerSocket) {
  ZerodHarness zerod;
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  const std::string data = zerod.dir().path() + "/data";
  TempDir other;
  auto start = [&](const std::string& socket, const std::string& data_dir) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{Built(ZEROD_PATH), "--socket", socket, "--listen", "",
                                 "--data-dir", data_dir},
        other.path() + "/second.log");
  };
  // The same data dir behind another socket: refused (two writers of one SQLite file lost
  // acknowledged writes), naming the holder.
  auto same_dir = start(other.path() + "/b.sock", data);
  EXPECT_EQ(same_dir->Wait(absl::Seconds(20)), 1);
  EXPECT_THAT(same_dir->Output(),
              HasSubstr("data dir " + data + " is in use by another zerod (pid"));
  // The live daemon's socket with another data dir: refused; it is not unlinked from under the
  // daemon, which keeps answering on it.
  const std::string socket = zerod.endpoint().substr(std::string("unix://").size());
  auto same_socket = start(socket, other.path() + "/data");
  EXPECT_EQ(same_socket->Wait(absl::Seconds(20)), 1);
  EXPECT_THAT(same_socket->Output(), HasSubstr("socket " + socket + " is in use by another zerod"));
  EXPECT_TRUE(zerod.Client()->ListJobs().ok());
  // The state is the daemon user's only: it holds every job's rendezvous keys.
  struct stat st {};
  ASSERT_EQ(stat(data.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((data + "/zerod.db").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // An existing folder given as the data dir keeps its mode when nobody else may write it (others
  // may read it); the state in it is private all the same.
  const std::string shared = other.path() + "/shared";
  ASSERT_EQ(mkdir(shared.c_str(), 0755), 0);
  ASSERT_EQ(chmod(shared.c_str(), 0755), 0);
  auto in_shared = start(other.path() + "/c.sock", shared);
  struct stat db {};
  Eventually([&] { return stat((shared + "/zerod.db").c_str(), &db) == 0; }, absl::Seconds(10));
  EXPECT_EQ(db.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(shared.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
  in_shared.reset();
  // A daemon killed outright leaves no claim behind: the next one takes dir and socket.
  zerod.Crash();
  ASSERT_NO_FATAL_FAILURE(zerod.Start());
  EXPECT_TRUE(zerod.Client()->ListJobs().ok());
}

}  // namespace
}  // namespace zerod::testing
