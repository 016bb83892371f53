// cluster_probe: one thing an outsider tries against a zerod cluster on etcd (cluster_security_test
// runs it as another Unix user, and as a holder of the wrong certificate): a call to etcd or to a
// zerod, with only the credentials and headers given, printing {"code": N, "message": "...", ...}
// (code -1: a file given could not be read).
//
//   cluster_probe --endpoint HOST:PORT --call etcd-get|etcd-put|list-jobs|node-heartbeat|join|end
//                 [--ca FILE [--cert FILE --key FILE]] [--header KEY=VALUE]...
//                 [--etcd-key K] [--value V] [--job J] [--token T]

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "proto/auth_metadata.h"
#include "proto/plan_convert.h"
#include "runtime/plan/digest.h"
#include "runtime/plan/synthetic_layout.h"
#include "zerod/v1/coordinator.grpc.pb.h"
#include "zerod/v1/inspect.grpc.pb.h"

namespace {

using nlohmann::json;

bool ReadFile(const std::string& path, std::string* text) {
  std::ifstream in(path);
  if (!in) return false;
  std::stringstream s;
  s << in.rdbuf();
  *text = s.str();
  return true;
}

json Outcome(const grpc::Status& status) {
  return {{"code", static_cast<int>(status.error_code())}, {"message", status.error_message()}};
}

json CallZerod(const std::shared_ptr<grpc::Channel>& channel, const std::string& call,
               const std::vector<std::pair<std::string, std::string>>& headers,
               const std::string& job, const std::string& token) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  for (const auto& [key, value] : headers) context.AddMetadata(key, value);
  if (!token.empty()) context.AddMetadata(zerod::rpc::kJobTokenMetadata, token);
  if (call == "list-jobs") {
    zerod::v1::ListJobsResponse response;
    const grpc::Status s = zerod::v1::Inspect::NewStub(channel)->ListJobs(
        &context, zerod::v1::ListJobsRequest(), &response);
    json out = Outcome(s);
    out["jobs"] = response.jobs_size();
    return out;
  }
  auto coordinator = zerod::v1::Coordinator::NewStub(channel);
  if (call == "node-heartbeat") {
    zerod::v1::NodeHeartbeatRequest request;
    zerod::v1::NodeHeartbeatEntry* entry = request.add_entries();
    entry->set_job_token(token);
    entry->mutable_heartbeat()->set_job_id(job);
    zerod::v1::NodeHeartbeatResponse response;
    return Outcome(coordinator->NodeHeartbeat(&context, request, &response));
  }
  if (call == "end") {
    zerod::v1::EndJobRequest request;
    request.set_job_id(job);
    zerod::v1::EndJobResponse response;
    return Outcome(coordinator->EndJob(&context, request, &response));
  }
  // join: a job of one rank, so it forms at once and the answer carries node_address.
  zerod::v1::JoinRequest request;
  request.set_job_id(job);
  request.set_world_size(1);
  request.set_rank(0);
  request.set_host("outsider");
  request.set_device("cpu");
  const auto layout = zerod::plan::SyntheticLayout(1000, zerod::DType::kBFloat16, 8);
  zerod::rpc::ToProto(layout, request.mutable_layout());
  request.set_layout_digest(zerod::plan::DigestHex(zerod::plan::LayoutDigest(layout)));
  zerod::v1::JoinResponse response;
  json out = Outcome(coordinator->Join(&context, request, &response));
  out["node_address"] = response.node_address();
  return out;
}

json CallEtcd(const std::shared_ptr<grpc::Channel>& channel, const std::string& call,
              const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  auto kv = etcdserverpb::KV::NewStub(channel);
  if (call == "etcd-put") {
    etcdserverpb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    etcdserverpb::PutResponse response;
    return Outcome(kv->Put(&context, request, &response));
  }
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  etcdserverpb::RangeResponse response;
  json out = Outcome(kv->Range(&context, request, &response));
  out["found"] = response.kvs_size();
  if (response.kvs_size() == 1) out["value"] = response.kvs(0).value();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string endpoint, call, ca, cert, key, etcd_key, value = "forged", job, token;
  std::vector<std::string> header_args;
  CLI::App app{"cluster_probe"};
  app.add_option("--endpoint", endpoint)->required();
  app.add_option("--call", call)
      ->required()
      ->check(
          CLI::IsMember({"etcd-get", "etcd-put", "list-jobs", "node-heartbeat", "join", "end"}));
  app.add_option("--ca", ca);
  app.add_option("--cert", cert);
  app.add_option("--key", key);
  app.add_option("--header", header_args);
  app.add_option("--etcd-key", etcd_key);
  app.add_option("--value", value);
  app.add_option("--job", job);
  app.add_option("--token", token);
  CLI11_PARSE(app, argc, argv);

  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!ca.empty()) {
    grpc::SslCredentialsOptions tls;
    for (const auto& [path, text] :
         {std::pair{ca, &tls.pem_root_certs}, std::pair{cert, &tls.pem_cert_chain},
          std::pair{key, &tls.pem_private_key}}) {
      if (!path.empty() && !ReadFile(path, text)) {
        std::cout << json{{"code", -1},
                          {"message", "cannot read " + path + ": " + std::strerror(errno)}}
                         .dump()
                  << "\n";
        return 0;
      }
    }
    credentials = grpc::SslCredentials(tls);
  }
  std::vector<std::pair<std::string, std::string>> headers;
  for (const std::string& h : header_args) {
    const size_t eq = h.find('=');
    headers.emplace_back(h.substr(0, eq), eq == std::string::npos ? "" : h.substr(eq + 1));
  }
  auto channel = grpc::CreateChannel(endpoint, credentials);
  const json out = call.rfind("etcd-", 0) == 0 ? CallEtcd(channel, call, etcd_key, value)
                                               : CallZerod(channel, call, headers, job, token);
  std::cout << out.dump() << "\n";
  return 0;
}
