// The forwarding server of a follower zerod against a real zerod as the leader: a real zerod
// process on a TCP port, the ForwardingServer in this process pointing at it, and the SDK, raw gRPC
// stubs and zeroctl calling the forwarder's Unix socket.

#include "server/cluster/forwarding_server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "client/credentials.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/auth_metadata.h"
#include "runtime/common/mutex.h"
#include "runtime/plan/synthetic_layout.h"
#include "tests/integration/zerod_harness.h"
#include "tests/server/cluster/leader_process.h"
#include "tests/util/process.h"
#include "tests/util/subprocess.h"
#include "zerod/v1/coordinator.grpc.pb.h"
#include "zerod/v1/inspect.grpc.pb.h"
#include "zerod/v1/store.grpc.pb.h"

namespace zerod::server::cluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using zerod::testing::Built;
using zerod::testing::ChildProcess;
using zerod::testing::ProcessResult;
using zerod::testing::RunProcess;
using zerod::testing::Scaled;
using zerod::testing::TempDir;

using Leader = LeaderProcess;

// A forwarder on a socket in its own temp dir, pointing at `leader_endpoint`.
class Follower {
 public:
  explicit Follower(const std::string& leader_endpoint, ForwardingOptions options = {}) {
    options.socket_path = socket();
    options.listen_address = "127.0.0.1:0";
    options.leader_endpoint = leader_endpoint;
    auto started = ForwardingServer::Start(std::move(options));
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) server_ = *std::move(started);
  }

  ForwardingServer& server() { return *server_; }
  void Stop() { server_.reset(); }
  std::string socket() const { return dir_.path() + "/follower.sock"; }
  std::string endpoint() const { return "unix://" + socket(); }
  std::shared_ptr<grpc::Channel> Channel() const {
    return grpc::CreateChannel("unix:" + socket(), grpc::InsecureChannelCredentials());
  }
  std::unique_ptr<client::CoordinatorClient> Client(const std::string& job_token = "") const {
    client::ClientOptions options;
    options.endpoint = endpoint();
    options.retry_for = Scaled(absl::Seconds(10));
    options.call_timeout = Scaled(options.call_timeout);
    options.job_token = job_token;
    auto c = client::CoordinatorClient::Connect(options);
    EXPECT_TRUE(c.ok()) << c.status();
    return *std::move(c);
  }

 private:
  TempDir dir_;
  std::unique_ptr<ForwardingServer> server_;
};

std::unique_ptr<client::CoordinatorClient> ClientOf(const std::string& endpoint) {
  client::ClientOptions options;
  options.endpoint = endpoint;
  options.retry_for = Scaled(absl::Seconds(10));
  options.call_timeout = Scaled(options.call_timeout);
  auto c = client::CoordinatorClient::Connect(options);
  EXPECT_TRUE(c.ok()) << c.status();
  return *std::move(c);
}

client::JoinOptions RankOf(const std::string& job, int64_t world, int64_t rank) {
  client::JoinOptions join;
  join.job_id = job;
  join.world_size = world;
  join.rank = rank;
  join.host = "node-" + std::to_string(rank);
  join.device = "cpu";
  join.layout = plan::SyntheticLayout(1000, DType::kBFloat16, 8);
  return join;
}

TEST(ForwardingServer, ATwoRankJobFormsWithOneRankDirectAndOneForwardedAndZeroctlShowsIt) {
  Leader leader;
  ASSERT_GT(leader.port(), 0) << leader.Log();
  Follower follower(leader.tcp_endpoint());
  auto direct = ClientOf("unix://" + leader.socket());
  auto forwarded = follower.Client();

  absl::StatusOr<client::Membership> rank0 = absl::UnknownError("not joined");
  std::thread joiner(
      [&] { rank0 = direct->Join(RankOf("pair", 2, 0), Scaled(absl::Seconds(60))); });
  auto rank1 = forwarded->Join(RankOf("pair", 2, 1), Scaled(absl::Seconds(60)));
  joiner.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  EXPECT_EQ(rank1->rank, 1);
  EXPECT_EQ(rank1->world_size, 2);

  auto plan = forwarded->GetPlan("pair");
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->plan_digest(), direct->GetPlan("pair")->plan_digest());
  auto beat = forwarded->Heartbeat("pair", 1, rank1->generation, client::HeartbeatReport{});
  EXPECT_TRUE(beat.ok()) << beat.status();

  // The Store, both ways round.
  ASSERT_TRUE(forwarded->StoreSet("pair", "from-follower", "1").ok());
  EXPECT_EQ(*direct->StoreGet("pair", "from-follower", absl::ZeroDuration()), "1");
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(direct->StoreSet("pair", "from-leader", "2").ok());
  });
  EXPECT_TRUE(forwarded->StoreWait("pair", {"from-leader"}, Scaled(absl::Seconds(30))).ok());
  setter.join();
  EXPECT_EQ(*forwarded->StoreGet("pair", "from-leader", Scaled(absl::Seconds(5))), "2");
  absl::Status barrier0;
  std::thread other(
      [&] { barrier0 = direct->Barrier("pair", "b", 0, 2, Scaled(absl::Seconds(30))); });
  EXPECT_TRUE(forwarded->Barrier("pair", "b", 1, 2, Scaled(absl::Seconds(30))).ok());
  other.join();
  EXPECT_TRUE(barrier0.ok()) << barrier0;

  const ProcessResult members = RunProcess(
      {Built(ZEROCTL_PATH), "members", "pair", "--json", "--endpoint", follower.endpoint()});
  ASSERT_EQ(members.exit_code, 0) << members.err;
  const nlohmann::json m = nlohmann::json::parse(members.out);
  ASSERT_EQ(m["members"].size(), 2u) << members.out;
  EXPECT_EQ(m["members"][0]["state"], "active");
  EXPECT_EQ(m["members"][1]["state"], "active");

  EXPECT_TRUE(forwarded->Leave("pair", 1).ok());
  EXPECT_TRUE(direct->Leave("pair", 0).ok());
  EXPECT_GE(follower.server().forwarded_calls(), 9);
}

TEST(ForwardingServer, AValueOverGrpcsDefaultFourMegabytesGoesBothWays) {
  Leader leader({"--no-auth", "--max-value", "8MiB"});
  ASSERT_GT(leader.port(), 0) << leader.Log();
  Follower follower(leader.tcp_endpoint());
  auto forwarded = follower.Client();
  ASSERT_TRUE(forwarded->Join(RankOf("big", 1, 0), Scaled(absl::Seconds(60))).ok());
  const std::string value(6 << 20, 'x');
  const absl::Status set = forwarded->StoreSet("big", "k", value);
  ASSERT_TRUE(set.ok()) << set;
  auto got = forwarded->StoreGet("big", "k", absl::ZeroDuration());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size(), value.size());
}

TEST(ForwardingServer, ConcurrentCallsEachGetTheirOwnAnswerWhileOthersTimeOut) {
  Leader leader;
  ASSERT_GT(leader.port(), 0) << leader.Log();
  Follower follower(leader.tcp_endpoint());
  ASSERT_TRUE(follower.Client()->Join(RankOf("many", 1, 0), Scaled(absl::Seconds(60))).ok());
  constexpr int kThreads = 6;
  constexpr int kAddsEach = 20;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto client = follower.Client();
      for (int i = 0; i < kAddsEach; ++i) {
        EXPECT_TRUE(client->StoreAdd("many", "counter", 1).ok());
        // Every other thread also has waits that end at their deadline, in between.
        if (t % 2 == 1 && i % 5 == 0) {
          const absl::Status waited = client->StoreWait("many", {"never"}, absl::Milliseconds(50));
          EXPECT_EQ(waited.code(), absl::StatusCode::kDeadlineExceeded) << waited;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(*follower.Client()->StoreAdd("many", "counter", 0), kThreads * kAddsEach);
}

TEST(ForwardingServer, AWatchThroughTheForwarderStreamsTheSnapshotThenAMemberJoining) {
  Leader leader;
  ASSERT_GT(leader.port(), 0) << leader.Log();
  Follower follower(leader.tcp_endpoint());
  auto direct = ClientOf("unix://" + leader.socket());
  auto forwarded = follower.Client();
  std::thread rank0(
      [&] { EXPECT_TRUE(direct->Join(RankOf("w", 2, 0), Scaled(absl::Seconds(60))).ok()); });
  while (!direct->DescribeJob("w").ok()) absl::SleepFor(absl::Milliseconds(20));

  std::vector<v1::JobEvent> events;
  std::unique_ptr<std::thread> rank1;
  auto joiner = follower.Client();
  const absl::Status watched = forwarded->Watch("w", [&](const v1::JobEvent& e) {
    events.push_back(e);
    if (e.kind() == v1::JobEvent::SNAPSHOT && rank1 == nullptr) {
      rank1 = std::make_unique<std::thread>(
          [&] { EXPECT_TRUE(joiner->Join(RankOf("w", 2, 1), Scaled(absl::Seconds(60))).ok()); });
    }
    return e.kind() != v1::JobEvent::MEMBER_JOINED || e.rank() != 1;
  });
  EXPECT_TRUE(watched.ok()) << watched;
  ASSERT_NE(rank1, nullptr);
  rank1->join();
  rank0.join();
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.front().kind(), v1::JobEvent::SNAPSHOT);
  EXPECT_EQ(events.back().kind(), v1::JobEvent::MEMBER_JOINED);
  EXPECT_EQ(events.back().rank(), 1);
}

TEST(ForwardingServer, TheCallersDeadlineReachesTheLeaderWhichAnswersBeforeIt) {
  Leader leader;
  ASSERT_GT(leader.port(), 0) << leader.Log();
  Follower follower(leader.tcp_endpoint());
  ASSERT_TRUE(follower.Client()->Join(RankOf("d", 1, 0), Scaled(absl::Seconds(60))).ok());
  auto store = v1::Store::NewStub(follower.Channel());
  grpc::ClientContext context;
  // Real time: the leader answers a fixed 200 ms before the deadline it was given.
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  v1::WaitRequest request;
  request.set_job_id("d");
  request.add_keys("never");
  request.set_timeout_ms(600'000);
  v1::WaitResponse response;
  const absl::Time start = absl::Now();
  const grpc::Status s = store->Wait(&context, request, &response);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  // The leader's own answer, sent a little before the deadline it was given: without the deadline
  // it would have waited its 10 minutes and the caller's timer would have said "Deadline Exceeded".
  EXPECT_THAT(s.error_message(), HasSubstr("keys not set in time")) << s.error_message();
  EXPECT_GE(took, absl::Seconds(1));
  EXPECT_LT(took, Scaled(absl::Seconds(15)));
}

TEST(ForwardingServer, ACallerThatCancelsCancelsTheLeaderCall) {
  Leader leader;
  ASSERT_GT(leader.port(), 0) << leader.Log();
  Follower follower(leader.tcp_endpoint());
  ASSERT_TRUE(follower.Client()->Join(RankOf("c", 1, 0), Scaled(absl::Seconds(60))).ok());
  auto store = v1::Store::NewStub(follower.Channel());
  grpc::ClientContext context;
  v1::WaitRequest request;
  request.set_job_id("c");
  request.add_keys("never");
  request.set_timeout_ms(600'000);
  v1::WaitResponse response;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(500));
    context.TryCancel();
  });
  const grpc::Status s = store->Wait(&context, request, &response);
  canceller.join();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::CANCELLED) << s.error_message();
  // A forwarded call ends only when its leader call does: with the leader's wait cancelled, no
  // call is left for the grace to wait on (else Shutdown would take all of it).
  const absl::Time start = absl::Now();
  follower.server().Shutdown(Scaled(absl::Seconds(60)));
  EXPECT_LT(absl::Now() - start, Scaled(absl::Seconds(30)));
}

TEST(ForwardingServer, TheJobTokenPassesThroughAndTheLeaderRefusesAWrongOne) {
  Leader leader(std::vector<std::string>{});  // authentication on
  ASSERT_GT(leader.port(), 0) << leader.Log();
  Follower follower(leader.tcp_endpoint());
  const std::string token = client::NewToken();
  auto owner = follower.Client(token);
  ASSERT_TRUE(owner->Join(RankOf("tok", 1, 0), Scaled(absl::Seconds(60))).ok());
  EXPECT_TRUE(owner->StoreSet("tok", "k", "owned").ok());
  auto stranger = follower.Client(client::NewToken());
  const absl::Status refused = stranger->StoreSet("tok", "k", "stolen");
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("tok")) << refused;
  EXPECT_EQ(*owner->StoreGet("tok", "k", absl::ZeroDuration()), "owned");
}

// A fake leader, to see what arrives: a gRPC server that records each call's method and metadata
// and refuses it with FAILED_PRECONDITION, a message and trailing metadata.
class RecordingLeader final : public grpc::CallbackGenericService {
 public:
  RecordingLeader() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterCallbackGenericService(this);
    server_ = builder.BuildAndStart();
  }
  ~RecordingLeader() override { server_->Shutdown(); }

  std::string endpoint() const { return absl::StrCat("127.0.0.1:", port_); }
  std::string method() {
    MutexLock lock(&mu_);
    return method_;
  }
  std::multimap<std::string, std::string> metadata() {
    MutexLock lock(&mu_);
    return metadata_;
  }

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    {
      MutexLock lock(&mu_);
      method_ = ctx->method();
      for (const auto& [key, value] : ctx->client_metadata()) {
        metadata_.emplace(std::string(key.data(), key.size()),
                          std::string(value.data(), value.size()));
      }
    }
    class Refuse : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refuse(grpc::GenericCallbackServerContext* ctx) {
        ctx->AddTrailingMetadata("recorded-by", "fake-leader");
        Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the fake leader says no"));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse(ctx);
  }

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  Mutex mu_;
  std::string method_ ABSL_GUARDED_BY(mu_);
  std::multimap<std::string, std::string> metadata_ ABSL_GUARDED_BY(mu_);
};

TEST(ForwardingServer, TheCallersMetadataGoesOnWithTheAddedButNoClaimToBeAClusterMember) {
  RecordingLeader leader;
  ForwardingOptions options;
  options.added_metadata = {{rpc::kForwardedViaMetadata, "unix"},
                            {rpc::kNodeAddressMetadata, "10.0.0.7"}};
  Follower follower(leader.endpoint(), options);
  auto inspect = v1::Inspect::NewStub(follower.Channel());
  grpc::ClientContext context;
  context.AddMetadata(rpc::kJobTokenMetadata, "the-token");
  context.AddMetadata(rpc::kForwardedViaMetadata, "forged");
  context.AddMetadata(rpc::kNodeAddressMetadata, "forged");
  context.AddMetadata("x-trace-bin", std::string("\x00\xff", 2));
  v1::DescribeJobRequest request;
  request.set_job_id("j");
  v1::JobDescription response;
  const grpc::Status s = inspect->DescribeJob(&context, request, &response);
  // The leader's status and trailing metadata come back as it sent them.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "the fake leader says no");
  const auto trailing = context.GetServerTrailingMetadata();
  ASSERT_EQ(trailing.count("recorded-by"), 1u);
  EXPECT_EQ(trailing.find("recorded-by")->second, "fake-leader");

  EXPECT_EQ(leader.method(), "/zerod.v1.Inspect/DescribeJob");
  const auto metadata = leader.metadata();
  auto only = [&](const std::string& key) {
    EXPECT_EQ(metadata.count(key), 1u) << key;
    return metadata.count(key) == 1 ? metadata.find(key)->second : "";
  };
  EXPECT_EQ(only(rpc::kJobTokenMetadata), "the-token");
  EXPECT_EQ(only(rpc::kForwardedViaMetadata), "unix");
  EXPECT_EQ(only(rpc::kNodeAddressMetadata), "10.0.0.7");
  EXPECT_EQ(only("x-trace-bin"), std::string("\x00\xff", 2));
  EXPECT_EQ(follower.server().forwarded_calls(), 1);
}

TEST(ForwardingServer, ShutdownWhileAWatchStreamsEndsItUnavailable) {
  Leader leader;
  ASSERT_GT(leader.port(), 0) << leader.Log();
  Follower follower(leader.tcp_endpoint());
  auto direct = ClientOf("unix://" + leader.socket());
  ASSERT_TRUE(direct->Join(RankOf("s", 1, 0), Scaled(absl::Seconds(60))).ok());
  auto coordinator = v1::Coordinator::NewStub(follower.Channel());
  grpc::ClientContext context;
  v1::WatchRequest request;
  request.set_job_id("s");
  auto stream = coordinator->Watch(&context, request);
  v1::JobEvent event;
  ASSERT_TRUE(stream->Read(&event));
  EXPECT_EQ(event.kind(), v1::JobEvent::SNAPSHOT);
  follower.server().Shutdown(absl::ZeroDuration());
  while (stream->Read(&event)) {
  }
  const grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
}

TEST(ForwardingServer, WithTheLeaderKilledCallsFailUnavailableNamingItAndTheForwarderLives) {
  auto leader = std::make_unique<Leader>();
  ASSERT_GT(leader->port(), 0) << leader->Log();
  const std::string leader_endpoint = leader->tcp_endpoint();
  Follower follower(leader_endpoint);
  auto direct = ClientOf("unix://" + leader->socket());
  ASSERT_TRUE(direct->Join(RankOf("k", 1, 0), Scaled(absl::Seconds(60))).ok());
  // A Watch streaming when the leader goes.
  auto coordinator = v1::Coordinator::NewStub(follower.Channel());
  grpc::ClientContext watch_context;
  v1::WatchRequest watch;
  watch.set_job_id("k");
  auto stream = coordinator->Watch(&watch_context, watch);
  v1::JobEvent event;
  ASSERT_TRUE(stream->Read(&event));

  leader->Crash();
  while (stream->Read(&event)) {
  }
  const grpc::Status ended = stream->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAVAILABLE) << ended.error_message();
  EXPECT_THAT(ended.error_message(), HasSubstr(leader_endpoint));

  auto inspect = v1::Inspect::NewStub(follower.Channel());
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(30))));
    v1::ListJobsResponse response;
    const absl::Time start = absl::Now();
    const grpc::Status s = inspect->ListJobs(&context, v1::ListJobsRequest(), &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("leader zerod at " + leader_endpoint));
    EXPECT_LT(absl::Now() - start, Scaled(absl::Seconds(15))) << "fails fast, not at the deadline";
  }
}

// grpc.health.v1.Health/Check with an empty request (the whole server); its answer's bytes.
grpc::Status CheckHealth(const std::shared_ptr<grpc::Channel>& channel, std::string* answer) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + Scaled(absl::Seconds(30))));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  grpc::ByteBuffer response;
  Mutex mu;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   MutexLock lock(&mu);
                   status = s;
                   done = true;
                 });
  MutexLock lock(&mu);
  mu.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done; });
  std::vector<grpc::Slice> slices;
  if (status.ok() && response.Dump(&slices).ok()) {
    for (const auto& slice : slices) {
      answer->append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
  }
  return status;
}

TEST(ForwardingServer, HealthIsAnsweredLocallyEvenWithNoLeader) {
  // Port 1 on loopback: nothing listens there.
  Follower follower("127.0.0.1:1");
  std::string answer;
  const grpc::Status s = CheckHealth(follower.Channel(), &answer);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(answer, std::string("\x08\x01", 2));  // HealthCheckResponse{status: SERVING}
  EXPECT_EQ(follower.server().forwarded_calls(), 0);
  // While everything else fails, naming the leader.
  auto inspect = v1::Inspect::NewStub(follower.Channel());
  grpc::ClientContext context;
  v1::ListJobsResponse response;
  const grpc::Status listed = inspect->ListJobs(&context, v1::ListJobsRequest(), &response);
  EXPECT_EQ(listed.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(listed.error_message(), HasSubstr("leader zerod at 127.0.0.1:1 unavailable"));
}

TEST(ForwardingServer, TheSocketGetsTheGivenModeAndBadOptionsAreRefused) {
  TempDir dir;
  ForwardingOptions options;
  options.socket_path = dir.path() + "/f.sock";
  options.socket_mode = 0600;
  options.leader_endpoint = "127.0.0.1:1";
  auto server = ForwardingServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat st {};
  ASSERT_EQ(stat(options.socket_path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ((*server)->tcp_port(), 0);

  ForwardingOptions nothing;
  nothing.leader_endpoint = "127.0.0.1:1";
  EXPECT_EQ(ForwardingServer::Start(nothing).status().code(), absl::StatusCode::kInvalidArgument);
  ForwardingOptions leaderless;
  leaderless.listen_address = "127.0.0.1:0";
  const absl::Status no_leader = ForwardingServer::Start(leaderless).status();
  EXPECT_EQ(no_leader.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_leader.message(), HasSubstr("leader"));
}

}  // namespace
}  // namespace zerod::server::cluster
