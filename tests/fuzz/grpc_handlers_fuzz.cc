// Every gRPC method of the daemon (Coordinator, Store, Inspect), fed fuzzed request bytes over a
// real channel to a real Daemon in this process (Unix socket, SQLite state in a temp dir). One
// daemon serves every input, so state built by one input (a job, store keys) is there for the
// next. An input is up to kMaxCalls calls, each a method byte and the request's bytes
// (fuzz_records.h); the bytes go on the wire as they are, so the server's own parsing is fuzzed
// too. Calls carry a short deadline: a join that waits for other ranks, or a store wait, ends by
// it, which exercises cancellation. Every kProbeEvery inputs the daemon must still answer.
// Authentication is on, as in production: the method byte's high bits pick what a call presents
// (job token A, which the seeds use and which claims the jobs they create; job token B; the admin
// token; nothing), so the fuzzer reaches both the handlers and their refusals.

#include <fuzzer/FuzzedDataProvider.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <memory>
#include <string>

#include "proto/auth_metadata.h"
#include "server/auth/token_digest.h"
#include "server/daemon.h"
#include "server/logging.h"
#include "tests/fuzz/fuzz_records.h"
#include "tests/fuzz/quiet_logs.h"
#include "zerod/v1/coordinator.grpc.pb.h"
#include "zerod/v1/inspect.grpc.pb.h"

namespace {

namespace fs = std::filesystem;

constexpr int kMaxCalls = 8;
constexpr int kProbeEvery = 256;
constexpr auto kCallDeadline = std::chrono::milliseconds(20);
// Generous: the machine may be loaded; only a daemon that stopped answering takes this long.
constexpr auto kProbeDeadline = std::chrono::seconds(30);

// Unary methods, by full name; the method byte picks one (or Watch, the one stream).
constexpr const char* kUnary[] = {
    "/zerod.v1.Coordinator/Join",
    "/zerod.v1.Coordinator/GetPlan",
    "/zerod.v1.Coordinator/Heartbeat",
    "/zerod.v1.Coordinator/Leave",
    "/zerod.v1.Coordinator/EndJob",
    "/zerod.v1.Store/Set",
    "/zerod.v1.Store/Get",
    "/zerod.v1.Store/Add",
    "/zerod.v1.Store/CompareSet",
    "/zerod.v1.Store/Delete",
    "/zerod.v1.Store/Wait",
    "/zerod.v1.Store/Barrier",
    "/zerod.v1.Inspect/ListJobs",
    "/zerod.v1.Inspect/DescribeJob",
    "/zerod.v1.Inspect/ShardMap",
    "/zerod.v1.Coordinator/RecordCheckpoint",
    "/zerod.v1.Inspect/ListCheckpoints",
};
constexpr size_t kMethods = std::size(kUnary) + 1;  // + Watch

struct World {
  std::unique_ptr<zerod::server::Daemon> daemon;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> generic;
  std::unique_ptr<zerod::v1::Coordinator::Stub> coordinator;
  std::unique_ptr<zerod::v1::Inspect::Stub> inspect;
  std::string admin_token;
};

enum class Presents { kTokenA, kTokenB, kAdmin, kNothing };

void AddCredentials(const World& w, Presents who, grpc::ClientContext& context) {
  switch (who) {
    case Presents::kTokenA:
      context.AddMetadata(zerod::rpc::kJobTokenMetadata, "fuzz-job-token-a");
      break;
    case Presents::kTokenB:
      context.AddMetadata(zerod::rpc::kJobTokenMetadata, "fuzz-job-token-b");
      break;
    case Presents::kAdmin:
      context.AddMetadata(zerod::rpc::kAdminTokenMetadata, w.admin_token);
      break;
    case Presents::kNothing:
      break;
  }
}

World& GetWorld() {
  static World* w = [] {
    auto* w = new World;
    zerod::server::SetLogLevel("off");
    const fs::path dir = zerod::fuzz::ScratchDir("zerod-grpc-fuzz");
    fs::create_directories(dir / "data");
    zerod::server::DaemonOptions options;
    options.socket_path = (dir / "zerod.sock").string();
    options.data_dir = (dir / "data").string();
    options.durability = zerod::server::Durability::kNormal;
    auto daemon = zerod::server::Daemon::Start(options);
    if (!daemon.ok()) {
      fprintf(stderr, "grpc_handlers_fuzz: %s\n", std::string(daemon.status().message()).c_str());
      std::abort();
    }
    w->daemon = *std::move(daemon);
    auto admin = zerod::server::auth::LoadOrCreateAdminToken(options.data_dir + "/admin.token");
    if (!admin.ok()) {
      fprintf(stderr, "grpc_handlers_fuzz: %s\n", std::string(admin.status().message()).c_str());
      std::abort();
    }
    w->admin_token = *std::move(admin);
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    w->channel = grpc::CreateCustomChannel("unix:" + options.socket_path,
                                           grpc::InsecureChannelCredentials(), args);
    w->generic = std::make_unique<grpc::GenericStub>(w->channel);
    w->coordinator = zerod::v1::Coordinator::NewStub(w->channel);
    w->inspect = zerod::v1::Inspect::NewStub(w->channel);
    return w;
  }();
  return *w;
}

void CallUnary(World& w, Presents who, const char* method, const std::string& request) {
  grpc::ClientContext context;
  AddCredentials(w, who, context);
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  std::promise<grpc::Status> done;
  w.generic->UnaryCall(&context, method, grpc::StubOptions(), &in, &out,
                       [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status status = done.get_future().get();
  // ZEROD_FUZZ_VERBOSE=1: what each call got, to see which handlers the inputs reach.
  static const bool verbose = getenv("ZEROD_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    fprintf(stderr, "%s (credentials %d): %d %s\n", method, static_cast<int>(who),
            static_cast<int>(status.error_code()), status.error_message().c_str());
  }
}

void CallWatch(World& w, Presents who, const std::string& request) {
  zerod::v1::WatchRequest watch;
  if (!watch.ParseFromString(request)) return;
  grpc::ClientContext context;
  AddCredentials(w, who, context);
  context.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
  auto reader = w.coordinator->Watch(&context, watch);
  zerod::v1::JobEvent event;
  while (reader->Read(&event)) {
  }
  (void)reader->Finish();
}

// The daemon still answers a plain read: no deadlock, no stuck thread pool.
void Probe(World& w) {
  grpc::ClientContext context;
  AddCredentials(w, Presents::kAdmin, context);
  context.set_deadline(std::chrono::system_clock::now() + kProbeDeadline);
  zerod::v1::ListJobsResponse response;
  const grpc::Status s = w.inspect->ListJobs(&context, zerod::v1::ListJobsRequest(), &response);
  if (!s.ok()) {
    fprintf(stderr, "grpc_handlers_fuzz: the daemon stopped answering: %s\n",
            s.error_message().c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  zerod::fuzz::QuietProtobufLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  World& w = GetWorld();
  FuzzedDataProvider in(data, size);
  for (int call = 0; call < kMaxCalls && in.remaining_bytes() > 0; ++call) {
    // ConsumeIntegral reads from the end of the data; a method byte in front keeps seeds readable.
    const uint8_t selector = in.ConsumeBytes<uint8_t>(1)[0];
    const size_t method = selector % kMethods;
    const auto who = static_cast<Presents>(selector / kMethods % 4);
    const std::string request = in.ConsumeRandomLengthString(1 << 16);
    if (method < std::size(kUnary)) {
      CallUnary(w, who, kUnary[method], request);
    } else {
      CallWatch(w, who, request);
    }
  }
  static int inputs = 0;
  if (++inputs % kProbeEvery == 0) Probe(w);
  return 0;
}
