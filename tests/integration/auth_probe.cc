// auth_probe: makes one call about a job as whoever runs it (the auth tests run it as another
// Unix user), with the token given or none, and prints {"code": N, "message": "..."}.
//
//   auth_probe --endpoint E --job J --call set|get|delete|add|compare-set|wait|barrier|
//              heartbeat|leave|end|join|describe [--rank R] [--key K] [--token T]
//              [--host H --device D]

#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "client/coordinator_client.h"
#include "nlohmann/json.hpp"
#include "runtime/plan/synthetic_layout.h"
#include "tests/util/test_time.h"

int main(int argc, char** argv) {
  std::string endpoint, job, call, key = "k", token, host = "h", device = "cpu";
  int64_t rank = 0;
  CLI::App app{"auth_probe"};
  app.add_option("--endpoint", endpoint)->required();
  app.add_option("--job", job)->required();
  app.add_option("--call", call)->required();
  app.add_option("--rank", rank);
  app.add_option("--key", key);
  app.add_option("--token", token);
  app.add_option("--host", host);
  app.add_option("--device", device);
  CLI11_PARSE(app, argc, argv);

  zerod::client::ClientOptions options;
  options.endpoint = endpoint;
  options.job_token = token;
  options.retry_for = zerod::testing::Scaled(absl::Seconds(5));
  options.call_timeout = zerod::testing::Scaled(options.call_timeout);
  auto c = zerod::client::CoordinatorClient::Connect(options);
  if (!c.ok()) {
    std::cerr << c.status() << "\n";
    return 2;
  }
  zerod::client::CoordinatorClient& client = **c;
  absl::Status s;
  if (call == "set") {
    s = client.StoreSet(job, key, "forged");
  } else if (call == "get") {
    s = client.StoreGet(job, key, absl::ZeroDuration()).status();
  } else if (call == "delete") {
    s = client.StoreDelete(job, key).status();
  } else if (call == "add") {
    s = client.StoreAdd(job, key + "-counter", 1).status();
  } else if (call == "compare-set") {
    s = client.StoreCompareSet(job, key, std::nullopt, "forged").status();
  } else if (call == "wait") {
    s = client.StoreWait(job, {key}, absl::ZeroDuration());
  } else if (call == "barrier") {
    s = client.Barrier(job, "b", rank, 2, absl::Milliseconds(100));
  } else if (call == "heartbeat") {
    s = client.Heartbeat(job, rank, 1, {}).status();
  } else if (call == "leave") {
    s = client.Leave(job, rank).status();
  } else if (call == "end") {
    s = client.EndJob(job);
  } else if (call == "join") {
    zerod::client::JoinOptions join;
    join.job_id = job;
    join.world_size = 1;
    join.rank = rank;
    join.host = host;
    join.device = device;
    join.layout = zerod::plan::SyntheticLayout(1000, zerod::DType::kBFloat16, 8);
    s = client.Join(join, zerod::testing::Scaled(absl::Seconds(2))).status();
  } else if (call == "describe") {
    s = client.DescribeJob(job).status();
  } else {
    std::cerr << "unknown --call " << call << "\n";
    return 2;
  }
  std::cout << nlohmann::json{{"code", static_cast<int>(s.code())},
                              {"message", std::string(s.message())}}
                   .dump()
            << "\n";
  return 0;
}
