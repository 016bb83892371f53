// Writes the fuzz targets' binary seeds into tests/fuzz/corpus/<target>/ from real encoders: plan
// inputs as BuildPlan makes them, a job's records as FormationRecords writes them, the rows of a
// real state file, and request sequences for the gRPC target. The text seeds (layouts, sizes, C API
// options) are written by hand. Run by `scripts/fuzz.sh --make-corpus`.
//   make_corpus <corpus dir>

#include <sqlite3.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "proto/plan_convert.h"
#include "runtime/plan/digest.h"
#include "server/job.h"
#include "server/job_records.h"
#include "server/plan_builder.h"
#include "server/state/sqlite_kv_store.h"
#include "tests/fuzz/fuzz_records.h"
#include "zerod/v1/coordinator.pb.h"
#include "zerod/v1/inspect.pb.h"
#include "zerod/v1/store.pb.h"

namespace {

namespace fs = std::filesystem;
using namespace zerod;  // NOLINT: a generator, not library code

fs::path root;

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  const fs::path dir = root / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

std::vector<v1::TensorSpec> Layout() {
  google::protobuf::RepeatedPtrField<v1::TensorSpec> wire;
  rpc::ToProto({{"wte", {64, 16}, DType::kBFloat16, "embed"},
                {"h0.w", {16, 16}, DType::kBFloat16, "h0"},
                {"h0.b", {16}, DType::kBFloat16, "h0"},
                {"ln.g", {}, DType::kFloat32, ""}},
               &wire);
  return {wire.begin(), wire.end()};
}

std::string LayoutDigest(const std::vector<v1::TensorSpec>& layout) {
  google::protobuf::RepeatedPtrField<v1::TensorSpec> wire(layout.begin(), layout.end());
  return plan::DigestHex(plan::LayoutDigest(rpc::FromProto(wire)));
}

v1::PlanInputs Built(int stage, int64_t world_size, int64_t budget_bytes) {
  const std::vector<v1::TensorSpec> layout = Layout();
  const std::string digest = LayoutDigest(layout);
  v1::PlanOptions options;
  options.set_stage(stage);
  options.set_reduce_bucket_bytes(1024);
  options.set_gather_unit_bytes(2048);
  auto built = server::BuildPlan({.job_id = "fuzz",
                                  .layout = layout,
                                  .layout_digest = digest,
                                  .options = options,
                                  .world_size = world_size,
                                  .generation = 1,
                                  .budget_bytes = budget_bytes});
  if (!built.ok()) {
    fprintf(stderr, "make_corpus: %s\n", std::string(built.status().message()).c_str());
    std::exit(1);
  }
  return built->inputs;
}

void PlanInputsSeeds() {
  for (int stage : {0, 1, 2, 3}) {
    Write("plan_inputs_fuzz", absl::StrCat("stage", stage, ".bin"),
          Built(stage, 2, 0).SerializeAsString());
  }
  Write("plan_inputs_fuzz", "auto-budget.bin", Built(-1, 4, 1 << 20).SerializeAsString());
}

// A running job of two active ranks, as formation writes it.
std::vector<server::KvOp> RunningJobRecords(const std::string& job_id) {
  server::Job job(job_id);
  MutexLock lock(&job.mu);
  const v1::PlanInputs inputs = Built(3, 2, 0);
  job.world_size = 2;
  job.options = inputs.options();
  job.layout_digest = inputs.layout_digest();
  job.layout_digest_rank = 0;
  for (int r = 0; r < 2; ++r) {
    server::Member m;
    m.host = absl::StrCat("node", r);
    m.device = "cpu";
    m.budget_bytes = 1 << 30;
    m.layout_digest = inputs.layout_digest();
    job.members[r] = m;
  }
  return server::FormationRecords(job, inputs);
}

void JobRecordsSeeds() {
  const std::string prefix = server::JobPrefix("fuzz");
  std::string running, forming;
  for (const server::KvOp& op : RunningJobRecords("fuzz")) {
    if (op.kind != server::KvOp::Kind::kPut) continue;
    const std::string relative = op.key.substr(prefix.size());
    running += fuzz::EncodeString(relative) + fuzz::EncodeString(op.value);
    if (relative != "plan") forming += fuzz::EncodeString(relative) + fuzz::EncodeString(op.value);
  }
  Write("job_records_fuzz", "running.txt", running);
  Write("job_records_fuzz", "no-plan.txt", forming);
}

// The rows of a real state file holding a running job and a store key, one string per column.
void SqliteStateSeeds() {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("zerod-make-corpus-", getpid());
  fs::create_directories(dir);
  const std::string path = (dir / "zerod.db").string();
  {
    auto kv = server::SqliteKvStore::Open(path, server::Durability::kNormal);
    std::vector<server::KvOp> ops = RunningJobRecords("fuzz");
    ops.push_back(server::KvOp::Put("jobs/fuzz/kv/gen1/gloo/rank0", "127.0.0.1:4242"));
    ops.push_back(server::KvOp::Add("jobs/fuzz/kv/counter", 3));
    if (!kv.ok() || !(*kv)->CommitSync(std::move(ops)).ok()) std::exit(1);
  }
  sqlite3* db = nullptr;
  sqlite3_open(path.c_str(), &db);
  std::string seed;
  auto dump = [&](const char* sql, int skip_columns) {
    sqlite3_stmt* stmt = nullptr;
    sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
    while (sqlite3_step(stmt) == SQLITE_ROW) {
      for (int c = skip_columns; c < sqlite3_column_count(stmt); ++c) {
        const void* blob = sqlite3_column_blob(stmt, c);
        seed += fuzz::EncodeString(std::string(static_cast<const char*>(blob),
                                               static_cast<size_t>(sqlite3_column_bytes(stmt, c))));
      }
    }
    sqlite3_finalize(stmt);
  };
  dump("SELECT * FROM meta", 1);  // without the id
  dump("SELECT * FROM kv", 0);
  sqlite3_close(db);
  fs::remove_all(dir);
  Write("sqlite_state_fuzz", "running-job.txt", seed);
}

// The gRPC target's method bytes, in its kUnary order; Watch is last.
enum Method : char {
  kJoin,
  kGetPlan,
  kHeartbeat,
  kLeave,
  kEndJob,
  kSet,
  kGet,
  kAdd,
  kCompareSet,
  kDelete,
  kWait,
  kBarrier,
  kListJobs,
  kDescribeJob,
  kShardMap,
  kRecordCheckpoint,
  kListCheckpoints,
  kWatch
};

std::string Call(Method method, const google::protobuf::Message& request) {
  return std::string(1, method) + fuzz::EncodeString(request.SerializeAsString());
}

void GrpcSeeds() {
  v1::JoinRequest join;
  join.set_job_id("fz");
  join.set_world_size(1);
  join.set_rank(-1);
  join.set_host("node0");
  join.set_device("cpu");
  for (const v1::TensorSpec& t : Layout()) *join.add_layout() = t;
  join.set_layout_digest(LayoutDigest(Layout()));
  join.mutable_options()->set_stage(3);
  const std::string joined = Call(kJoin, join);
  v1::JoinRequest two = join;
  two.set_world_size(2);

  v1::HeartbeatRequest heartbeat;
  heartbeat.set_job_id("fz");
  heartbeat.set_generation(1);
  heartbeat.set_step(7);
  (*heartbeat.mutable_memory_bytes())["params"] = 4096;
  (*heartbeat.mutable_comm_bytes())["all_gather"] = 1024;
  v1::GetPlanRequest get_plan;
  get_plan.set_job_id("fz");
  v1::SetRequest set;
  set.set_job_id("fz");
  set.set_key("gen1/gloo/rank0");
  set.set_value("127.0.0.1:4242");
  v1::GetRequest get;
  get.set_job_id("fz");
  get.set_key("gen1/gloo/rank0");
  get.set_timeout_ms(10);
  v1::AddRequest add;
  add.set_job_id("fz");
  add.set_key("counter");
  add.set_delta(1);
  v1::CompareSetRequest cas;
  cas.set_job_id("fz");
  cas.set_key("owner");
  cas.set_expected_absent(true);
  cas.set_desired("rank0");
  v1::DeleteRequest del;
  del.set_job_id("fz");
  del.set_key("counter");
  v1::WaitRequest wait;
  wait.set_job_id("fz");
  wait.add_keys("gen1/gloo/rank0");
  wait.set_timeout_ms(10);
  v1::BarrierRequest barrier;
  barrier.set_job_id("fz");
  barrier.set_name("start");
  barrier.set_participant(0);
  barrier.set_count(1);
  barrier.set_timeout_ms(10);
  v1::DescribeJobRequest describe;
  describe.set_job_id("fz");
  v1::ShardMapRequest shards;
  shards.set_job_id("fz");
  v1::WatchRequest watch;
  watch.set_job_id("fz");
  v1::LeaveRequest leave;
  leave.set_job_id("fz");
  v1::EndJobRequest end;
  end.set_job_id("fz");

  v1::RecordCheckpointRequest saving;
  saving.set_job_id("fz");
  saving.mutable_record()->set_step(5);
  saving.mutable_record()->set_directory("/ckpt/step-00000005");
  saving.mutable_record()->set_world_size(1);
  saving.mutable_record()->set_stage(3);
  saving.mutable_record()->set_state(v1::CHECKPOINT_SAVING);
  v1::RecordCheckpointRequest complete = saving;
  complete.mutable_record()->set_state(v1::CHECKPOINT_COMPLETE);
  complete.mutable_record()->set_bytes(4096);
  v1::ListCheckpointsRequest checkpoints;
  checkpoints.set_job_id("fz");

  const std::string g = "grpc_handlers_fuzz";
  Write(g, "join.bin", joined);
  Write(g, "join-two-ranks.bin", Call(kJoin, two));
  Write(g, "heartbeat.bin", joined + Call(kHeartbeat, heartbeat));
  Write(g, "get-plan.bin", joined + Call(kGetPlan, get_plan));
  Write(g, "store.bin",
        joined + Call(kSet, set) + Call(kGet, get) + Call(kAdd, add) + Call(kCompareSet, cas) +
            Call(kWait, wait) + Call(kDelete, del));
  Write(g, "barrier.bin", joined + Call(kBarrier, barrier));
  Write(g, "inspect.bin",
        joined + Call(kListJobs, v1::ListJobsRequest()) + Call(kDescribeJob, describe) +
            Call(kShardMap, shards));
  Write(g, "watch.bin", joined + Call(kWatch, watch));
  Write(g, "leave-end.bin", joined + Call(kLeave, leave) + Call(kEndJob, end));
  Write(g, "checkpoints.bin",
        joined + Call(kRecordCheckpoint, saving) + Call(kRecordCheckpoint, complete) +
            Call(kListCheckpoints, checkpoints));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_corpus <corpus dir>\n");
    return 2;
  }
  root = argv[1];
  PlanInputsSeeds();
  JobRecordsSeeds();
  SqliteStateSeeds();
  GrpcSeeds();
  return 0;
}
