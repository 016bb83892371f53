// join_client: one real rank process for the integration tests. Joins a job through the SDK,
// optionally heartbeats, uses the store and leaves; prints one JSON line with what it got.
//
//   join_client --endpoint E --job J --world N [--rank R] [--params P] [--budget B]
//               [--stage S] [--heartbeat-ms T] [--run-ms T] [--set K=V] [--get K]
//               [--timeout-ms T] [--leave]
// Exit 0 on success; 1 with {"error_code": C, "error": "..."} otherwise. The times given are used
// as they are; its own bounds on the daemon (retries, the join) are scaled for the build.

#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "nlohmann/json.hpp"
#include "runtime/plan/synthetic_layout.h"
#include "tests/util/test_time.h"

int main(int argc, char** argv) {
  std::string endpoint, job, set, get;
  int64_t world = 1, rank = -1, params = 1 << 20, budget = 0, heartbeat_ms = 0, run_ms = 0,
          timeout_ms = 10000, stage = 2;
  bool leave = false;
  CLI::App app{"join_client"};
  app.add_option("--endpoint", endpoint);
  app.add_option("--job", job)->required();
  app.add_option("--world", world);
  app.add_option("--rank", rank);
  app.add_option("--params", params);
  app.add_option("--budget", budget);
  app.add_option("--stage", stage);
  app.add_option("--heartbeat-ms", heartbeat_ms);
  app.add_option("--run-ms", run_ms);
  app.add_option("--set", set);
  app.add_option("--get", get);
  app.add_option("--timeout-ms", timeout_ms);
  app.add_flag("--leave", leave);
  CLI11_PARSE(app, argc, argv);

  auto fail = [](const absl::Status& s) {
    std::cout << nlohmann::json{{"error_code", static_cast<int>(s.code())},
                                {"error", std::string(s.message())}}
                     .dump()
              << std::endl;
    return 1;
  };
  zerod::client::ClientOptions options;
  options.endpoint = endpoint;
  options.retry_for = zerod::testing::Scaled(absl::Seconds(30));
  options.call_timeout = zerod::testing::Scaled(options.call_timeout);
  auto client = zerod::client::CoordinatorClient::Connect(options);
  if (!client.ok()) return fail(client.status());
  zerod::client::JoinOptions join;
  join.job_id = job;
  join.world_size = world;
  join.rank = rank;
  join.budget_bytes = budget;
  join.layout = zerod::plan::SyntheticLayout(params, zerod::DType::kBFloat16, 8);
  join.plan_options.stage = static_cast<int>(stage);
  auto m = (*client)->Join(join, zerod::testing::Scaled(absl::Seconds(60)));
  if (!m.ok()) return fail(m.status());
  nlohmann::json out = {{"rank", m->rank},
                        {"generation", m->generation},
                        {"plan_digest", m->plan->DigestHex()},
                        {"stage", m->plan->stage()},
                        {"world_size", m->world_size}};
  std::atomic<int64_t> heartbeat_failures{0}, heartbeats{0};
  if (heartbeat_ms > 0) {
    (*client)->StartHeartbeats(
        job, m->rank, m->generation, absl::Milliseconds(heartbeat_ms),
        [&] {
          zerod::client::HeartbeatReport r;
          r.step = heartbeats.load();
          for (int c = 0; c < zerod::plan::kMemoryCategoryCount; ++c) {
            const auto cat = static_cast<zerod::plan::MemoryCategory>(c);
            r.memory_bytes[std::string(zerod::plan::MemoryCategoryName(cat))] =
                m->plan->MemoryForRank(m->rank)[cat];
          }
          return r;
        },
        [&](const absl::StatusOr<zerod::v1::HeartbeatResponse>& reply) {
          reply.ok() ? ++heartbeats : ++heartbeat_failures;
        });
  }
  if (!set.empty()) {
    const size_t eq = set.find('=');
    absl::Status s = (*client)->StoreSet(job, set.substr(0, eq), set.substr(eq + 1));
    if (!s.ok()) return fail(s);
  }
  if (!get.empty()) {
    auto value = (*client)->StoreGet(job, get, absl::Milliseconds(timeout_ms));
    if (!value.ok()) return fail(value.status());
    out["value"] = *value;
  }
  absl::SleepFor(absl::Milliseconds(run_ms));
  (*client)->StopHeartbeats();
  out["heartbeats"] = heartbeats.load();
  out["heartbeat_failures"] = heartbeat_failures.load();
  if (leave) {
    auto g = (*client)->Leave(job, m->rank);
    if (!g.ok()) return fail(g.status());
    out["left_generation"] = *g;
  }
  std::cout << out.dump() << std::endl;
  return 0;
}
