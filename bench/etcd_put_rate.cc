// etcd_put_rate: etcd's own write rate on this machine, the peer of zerod's numbers on etcd
// (bench/cluster_load.sh). T client threads, each its own gRPC channel to the members, put
// 64-byte values under a prefix for S seconds, one put in flight per thread, the way zerod's
// store commits one transaction at a time per daemon; then the prefix is deleted.
//
//   build/bin/etcd_put_rate --endpoints H:P[,H:P...] [--threads 8] [--seconds 3]
//       [--prefix /etcd-put-rate/] [--etcd-ca F --etcd-cert F --etcd-key F]
//
// Over TLS with a client certificate when given zerod's etcd flags (as zerod speaks to a secured
// etcd, docs/operators.md); the prefix must then be one that certificate's user may write.
//
// The last line is one JSON object: puts, seconds, puts_per_s, p50_ms, p99_ms.

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "server/state/etcd_security.h"
#include "server/state/internal/etcd_client.h"

int main(int argc, char** argv) {
  std::string endpoints, prefix = "/etcd-put-rate/";
  zerod::server::EtcdTlsFiles tls_files;
  int threads = 8;
  double seconds = 3;
  CLI::App app{"etcd_put_rate: etcd's own put rate (the peer of zerod on etcd)"};
  app.add_option("--endpoints", endpoints, "etcd members, host:port[,host:port...]")->required();
  app.add_option("--threads", threads, "Client threads, one put in flight each")
      ->capture_default_str();
  app.add_option("--seconds", seconds, "How long to put")->capture_default_str();
  app.add_option("--prefix", prefix, "Where to put (deleted at the end)")->capture_default_str();
  app.add_option("--etcd-ca", tls_files.ca, "etcd's CA: TLS");
  app.add_option("--etcd-cert", tls_files.cert, "Client certificate (its CN is the etcd user)");
  app.add_option("--etcd-key", tls_files.key, "Its key");
  CLI11_PARSE(app, argc, argv);
  const absl::StatusOr<zerod::server::EtcdTls> tls = zerod::server::LoadEtcdTls(tls_files);
  if (!tls.ok()) {
    std::fprintf(stderr, "etcd_put_rate: %s\n", std::string(tls.status().message()).c_str());
    return 2;
  }
  if (threads < 1 || threads > 1024 || seconds <= 0) {
    std::fprintf(stderr, "etcd_put_rate: --threads 1..1024 and --seconds > 0\n");
    return 2;
  }
  const std::vector<std::string> members = absl::StrSplit(endpoints, ',');
  const std::string value(64, 'v');
  std::atomic<int64_t> errors{0};
  std::vector<std::vector<double>> latencies(static_cast<size_t>(threads));
  // Every thread's channel connected (a TLS handshake, on a loaded machine) before the clock
  // starts: the rate is of puts, not of handshakes.
  std::vector<std::unique_ptr<zerod::server::internal::EtcdClient>> clients;
  for (int t = 0; t < threads; ++t) {
    auto client = zerod::server::internal::EtcdClient::Connect(members, absl::Seconds(5), *tls);
    if (!client.ok() || !(*client)->WaitForConnected(absl::Seconds(30))) {
      std::fprintf(stderr, "etcd_put_rate: no connection to %s\n", endpoints.c_str());
      return 1;
    }
    clients.push_back(*std::move(client));
  }
  const absl::Time start = absl::Now();
  const absl::Time stop = start + absl::Seconds(seconds);
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      zerod::server::internal::EtcdClient* client = clients[static_cast<size_t>(t)].get();
      for (int64_t i = 0; absl::Now() < stop; ++i) {
        etcdserverpb::TxnRequest txn;
        etcdserverpb::PutRequest* put = txn.add_success()->mutable_request_put();
        put->set_key(absl::StrCat(prefix, t, "/", i % 1024));
        put->set_value(value);
        etcdserverpb::TxnResponse response;
        const absl::Time sent = absl::Now();
        if (!client->Txn(txn, &response).ok()) {
          errors++;
          continue;
        }
        latencies[static_cast<size_t>(t)].push_back(absl::ToDoubleMilliseconds(absl::Now() - sent));
      }
    });
  }
  for (std::thread& w : workers) w.join();
  const double elapsed = absl::ToDoubleSeconds(absl::Now() - start);
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto at = [&](double q) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(q * all.size()))];
  };
  // Leave nothing behind.
  if (auto client = zerod::server::internal::EtcdClient::Connect(members, absl::Seconds(5), *tls);
      client.ok()) {
    etcdserverpb::TxnRequest txn;
    etcdserverpb::DeleteRangeRequest* del = txn.add_success()->mutable_request_delete_range();
    del->set_key(prefix);
    del->set_range_end(zerod::server::internal::PrefixEnd(prefix));
    etcdserverpb::TxnResponse response;
    (void)(*client)->Txn(txn, &response);
  }
  std::printf(
      "{\"puts\":%zu,\"errors\":%lld,\"threads\":%d,\"seconds\":%.3f,\"puts_per_s\":%.1f,"
      "\"p50_ms\":%.3f,\"p99_ms\":%.3f}\n",
      all.size(), static_cast<long long>(errors.load()), threads, elapsed,
      static_cast<double>(all.size()) / elapsed, at(0.5), at(0.99));
  return errors.load() > 0 && all.empty() ? 1 : 0;
}
