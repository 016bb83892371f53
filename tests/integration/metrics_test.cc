// zerod's /metrics under a real job: a real Prometheus scrapes it with the viewer token (its
// scrape config's authorization.credentials_file) and its HTTP API shows the series exist and
// move, while a scrape without the token is refused; promtool finds a scrape clean; the Grafana
// dashboard asks only for series zerod exports; another user (nobody) without the token gets
// nothing from the listener; a bad --http-listen is a usage error.

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/synthetic_layout.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr char kPrometheus[] = "/usr/bin/prometheus";
constexpr char kPromtool[] = "/usr/bin/promtool";

bool Installed(const char* path) { return access(path, X_OK) == 0; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A port free now on 127.0.0.1 (Prometheus cannot be told to pick one itself).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

// The port a daemon writes to `port_file` once it listens (0 if it does not within 10 s, scaled).
int PortIn(const std::string& port_file) {
  int port = 0;
  Eventually(
      [&] {
        const std::string text = ReadFile(port_file);
        if (text.find('\n') != std::string::npos) port = std::stoi(text);
        return port != 0;
      },
      absl::Seconds(10));
  return port;
}

// zerod with its HTTP listener on a port it picks; returns that port.
int StartWithHttp(ZerodHarness& zerod) {
  const std::string port_file = zerod.dir().path() + "/http.port";
  zerod.Start({"--http-listen", "127.0.0.1:0", "--http-port-file", port_file});
  const int port = PortIn(port_file);
  EXPECT_GT(port, 0) << zerod.Log();
  return port;
}

// The token zerod made for read-only views (its HTTP listener included).
std::string ViewerToken(const ZerodHarness& zerod) {
  return std::string(absl::StripAsciiWhitespace(ReadFile(zerod.data_dir() + "/viewer.token")));
}

std::string Scrape(int port, const std::string& token) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(absl::ToChronoSeconds(Scaled(absl::Seconds(30))));
  auto r = client.Get("/metrics", {{"Authorization", "Bearer " + token}});
  if (!r) return "";
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  return r->body;
}

// `world` train_mlp ranks of `job` running until killed; returns once rank 0 logged a step.
std::vector<std::unique_ptr<ChildProcess>> StartRanks(ZerodHarness& zerod, const std::string& job,
                                                      int world) {
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{Built(TRAIN_MLP_PATH), "--stage", "2", "--steps", "1000000"},
        absl::StrCat(zerod.dir().path(), "/", job, r, ".log"),
        std::vector<std::string>{"ZEROD_ENDPOINT=" + zerod.endpoint(), "ZEROD_JOB=" + job,
                                 absl::StrCat("ZEROD_RANK=", r),
                                 absl::StrCat("ZEROD_WORLD_SIZE=", world)}));
  }
  Eventually([&] { return ranks[0]->Output().find("step 2 ") != std::string::npos; },
             absl::Seconds(60));
  EXPECT_THAT(ranks[0]->Output(), HasSubstr("step 2 "));
  return ranks;
}

// Prometheus's answer to an instant query: the "result" array (empty on any failure).
json Query(int port, const std::string& promql) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(absl::ToChronoSeconds(Scaled(absl::Seconds(10))));
  auto r = client.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!r || r->status != 200) return json::array();
  const json answer = json::parse(r->body, nullptr, /*allow_exceptions=*/false);
  if (answer.is_discarded() || answer.value("status", "") != "success") return json::array();
  return answer["data"]["result"];
}

// The values of the query's series, by their labels' text.
std::map<std::string, double> Values(int port, const std::string& promql) {
  std::map<std::string, double> out;
  for (const json& series : Query(port, promql)) {
    out[series["metric"].dump()] = std::stod(series["value"][1].get<std::string>());
  }
  return out;
}

// Polls `promql` until `ok(values)` (generous: a loaded CI machine); returns the last values.
std::map<std::string, double> Await(
    int port, const std::string& promql,
    const std::function<bool(const std::map<std::string, double>&)>& ok,
    absl::Duration timeout = Scaled(absl::Seconds(120))) {
  const absl::Time deadline = absl::Now() + timeout;
  std::map<std::string, double> values;
  while (absl::Now() < deadline) {
    values = Values(port, promql);
    if (ok(values)) return values;
    absl::SleepFor(absl::Milliseconds(500));
  }
  ADD_FAILURE() << "no good answer to " << promql << " within " << timeout;
  return values;
}

double Sum(const std::map<std::string, double>& values) {
  double sum = 0;
  for (const auto& [labels, value] : values) sum += value;
  return sum;
}

TEST(Metrics, PrometheusScrapesARunningJobAndItsSeriesExistAndMove) {
  if (!Installed(kPrometheus)) GTEST_SKIP() << kPrometheus << " is absent: run scripts/setup.sh";
  ZerodHarness zerod;
  const int http_port = StartWithHttp(zerod);
  ASSERT_GT(http_port, 0);
  std::vector<std::unique_ptr<ChildProcess>> ranks = StartRanks(zerod, "scraped", 2);

  const int prometheus_port = FreePort();
  // As an operator would write it: the token read from the daemon's file at every scrape. And
  // the same target without it, which must stay down. A scrape times out after an interval: 1 s,
  // scaled for a slower build's daemon.
  const std::string target = absl::StrCat("      - targets: ['127.0.0.1:", http_port, "']\n");
  const std::string interval = ScaledFlag(absl::Seconds(1));
  const std::string config = zerod.dir().WriteFile(
      "prometheus.yml",
      absl::StrCat("global:\n  scrape_interval: ", interval, "\n  evaluation_interval: ", interval,
                   "\n"
                   "scrape_configs:\n  - job_name: zerod\n    authorization:\n"
                   "      type: Bearer\n      credentials_file: ",
                   zerod.data_dir(), "/viewer.token\n    static_configs:\n", target,
                   "  - job_name: anonymous\n    static_configs:\n", target));
  ChildProcess prometheus({kPrometheus, "--config.file=" + config,
                           "--storage.tsdb.path=" + zerod.dir().path() + "/prometheus",
                           absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port)},
                          zerod.dir().path() + "/prometheus.log");

  const auto two = [](const auto& v) { return v.size() == 2; };
  const auto positive = [](const auto& v) { return !v.empty() && Sum(v) > 0; };
  // The target is up and scraped; without the token it is down (zerod answered 401).
  Await(prometheus_port, "up{job=\"zerod\"} == 1", [](const auto& v) { return v.size() == 1; });
  Await(prometheus_port, "up{job=\"anonymous\"} == 0", [](const auto& v) { return v.size() == 1; });
  // Each rank's step exists, then moves.
  const auto steps = Await(prometheus_port, "zerod_rank_step{job_id=\"scraped\"}", two);
  Await(prometheus_port, "zerod_rank_step{job_id=\"scraped\"}", [&steps](const auto& v) {
    if (v.size() != 2) return false;
    for (const auto& [labels, step] : v) {
      if (!steps.contains(labels) || step <= steps.at(labels)) return false;
    }
    return true;
  });
  // Heartbeats count up.
  const double heartbeats =
      Sum(Await(prometheus_port, "zerod_heartbeats_total{job_id=\"scraped\"}", positive));
  Await(prometheus_port, "zerod_heartbeats_total{job_id=\"scraped\"}",
        [heartbeats](const auto& v) { return Sum(v) > heartbeats; });
  // The job and its ranks by state, joins, memory against the plan, bytes sent, the step rate.
  Await(prometheus_port, "zerod_jobs{state=\"running\"} == 1",
        [](const auto& v) { return v.size() == 1; });
  Await(prometheus_port, "zerod_job_ranks{job_id=\"scraped\",state=\"active\"} == 2",
        [](const auto& v) { return v.size() == 1; });
  Await(prometheus_port, "zerod_job_joins_total{job_id=\"scraped\"} >= 2",
        [](const auto& v) { return v.size() == 1; });
  Await(prometheus_port, "zerod_rank_memory_bytes{job_id=\"scraped\",category=\"params\"}", two);
  Await(prometheus_port, "zerod_job_plan_memory_bytes{job_id=\"scraped\",category=\"params\"}",
        positive);
  Await(prometheus_port, "zerod_job_comm_sent_bytes_total{job_id=\"scraped\"}", positive);
  Await(prometheus_port, "zerod_job_step_rate{job_id=\"scraped\"} > 0", positive);
  // Latencies and calls.
  Await(prometheus_port, "zerod_heartbeat_duration_seconds_count", positive);
  Await(prometheus_port, "zerod_sqlite_commit_duration_seconds_count", positive);
  Await(prometheus_port, "zerod_store_operations_total{code=\"OK\"}", positive);
  Await(prometheus_port,
        "zerod_grpc_calls_total{method=\"/zerod.v1.Coordinator/Heartbeat\",code=\"OK\"}", positive);
  if (HasFailure()) {
    ADD_FAILURE() << "prometheus log:\n" << prometheus.Output() << "\nzerod log:\n" << zerod.Log();
  }
}

TEST(Metrics, PromtoolFindsTheScrapeOfARunningJobClean) {
  if (!Installed(kPromtool)) GTEST_SKIP() << kPromtool << " is absent: run scripts/setup.sh";
  ZerodHarness zerod;
  const int http_port = StartWithHttp(zerod);
  ASSERT_GT(http_port, 0);
  std::vector<std::unique_ptr<ChildProcess>> ranks = StartRanks(zerod, "linted", 2);
  const std::string body = Scrape(http_port, ViewerToken(zerod));
  ASSERT_THAT(body, HasSubstr("zerod_rank_step{job_id=\"linted\",rank=\"1\"}"));
  const std::string file = zerod.dir().WriteFile("scrape.txt", body);
  // promtool reads the exposition on stdin; any lint finding is printed and exits non-zero.
  const ProcessResult lint =
      RunProcess({"/bin/sh", "-c", std::string(kPromtool) + " check metrics < " + file});
  EXPECT_EQ(lint.exit_code, 0) << lint.out << lint.err;
  EXPECT_EQ(lint.out + lint.err, "");
}

// The metric names a scrape declares, histograms' series included.
std::set<std::string> ExportedNames(const std::string& body) {
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (words.size() != 4 || words[0] != "#" || words[1] != "TYPE") continue;
    names.insert(words[2]);
    if (words[3] == "histogram") {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) names.insert(words[2] + suffix);
    }
  }
  return names;
}

TEST(Metrics, TheGrafanaDashboardAsksOnlyForSeriesZerodExports) {
  ZerodHarness zerod;
  const int http_port = StartWithHttp(zerod);
  ASSERT_GT(http_port, 0);
  const std::set<std::string> exported = ExportedNames(Scrape(http_port, ViewerToken(zerod)));
  ASSERT_TRUE(exported.contains("zerod_rank_step"));

  const json dashboard =
      json::parse(ReadFile(ZEROD_SOURCE_DIR "/deploy/grafana/zerod-dashboard.json"));
  std::vector<std::string> exprs;
  const std::function<void(const json&)> collect = [&](const json& node) {
    if (node.is_object()) {
      for (const auto& [key, value] : node.items()) {
        if ((key == "expr" || key == "query") && value.is_string()) exprs.push_back(value);
        collect(value);
      }
    } else if (node.is_array()) {
      for (const json& item : node) collect(item);
    }
  };
  collect(dashboard);
  ASSERT_GE(exprs.size(), 10u) << "the dashboard has its panels' queries";
  // Every "zerod_..." name in the queries (no std::regex: GCC 12's ASan build warns inside it).
  auto name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':';
  };
  std::set<std::string> used;
  for (const std::string& expr : exprs) {
    for (size_t at = expr.find("zerod_"); at != std::string::npos; at = expr.find("zerod_", at)) {
      size_t end = at;
      while (end < expr.size() && name_char(expr[end])) ++end;
      if (at == 0 || !name_char(expr[at - 1])) used.insert(expr.substr(at, end - at));
      at = end;
    }
  }
  for (const std::string& metric : used) {
    EXPECT_TRUE(exported.contains(metric))
        << "the dashboard queries " << metric << ", which zerod does not export";
  }
  EXPECT_GE(used.size(), 10u);
}

// Runs curl as the user nobody, with nothing of this process's environment; returns
// "<status>\n<body>" or curl's failure.
std::string CurlAsNobody(int port, const std::string& path, const std::string& token_file = "") {
  std::vector<std::string> argv = {
      "/usr/sbin/runuser", "-u", "nobody", "--", "/usr/bin/env", "-i", "/usr/bin/curl", "-sS", "-w",
      "\n%{http_code}"};
  if (!token_file.empty()) {
    // curl reads the header from the file as nobody: it gets in only if nobody may read it.
    argv.push_back("-H");
    argv.push_back("@" + token_file);
  }
  argv.push_back(absl::StrCat("http://127.0.0.1:", port, path));
  const ProcessResult r = RunProcess(argv);
  return r.exit_code == 0 ? r.out : absl::StrCat("curl failed (", r.exit_code, "): ", r.err);
}

TEST(Metrics, AnotherUserWithoutTheViewerTokenGetsNothingFromTheHttpListener) {
  if (geteuid() != 0 || access("/usr/sbin/runuser", X_OK) != 0 || !Installed("/usr/bin/curl")) {
    GTEST_SKIP() << "needs root, runuser and curl (scripts/setup.sh)";
  }
  ZerodHarness zerod;
  // nobody may traverse the test's directory to its own header file, and the group nogroup may
  // read the viewer token.
  ASSERT_EQ(chmod(zerod.dir().path().c_str(), 0711), 0);
  const std::string port_file = zerod.dir().path() + "/http.port";
  zerod.Start({"--http-listen", "127.0.0.1:0", "--http-port-file", port_file});
  const int port = PortIn(port_file);
  ASSERT_GT(port, 0) << zerod.Log();
  // A job whose name and host nobody must not learn.
  auto client = zerod.Client();
  client::JoinOptions secret;
  secret.job_id = "secret-job";
  secret.rank = 0;
  secret.host = "secret-host";
  secret.layout = plan::SyntheticLayout(1 << 12, DType::kBFloat16, 4);
  secret.plan_options.stage = 1;
  ASSERT_TRUE(client->Join(secret, Scaled(absl::Seconds(30))).ok());

  for (const char* path : {"/metrics", "/", "/api/jobs", "/api/jobs/secret-job", "/nope"}) {
    SCOPED_TRACE(path);
    const std::string answer = CurlAsNobody(port, path);
    EXPECT_THAT(answer, ::testing::EndsWith("\n401")) << answer;
    EXPECT_THAT(answer, ::testing::Not(HasSubstr("secret"))) << answer;
  }
  // The token file, as the daemon's user keeps it (0600): nobody cannot present it.
  const std::string header =
      zerod.dir().WriteFile("viewer.header", "Authorization: Bearer " + ViewerToken(zerod) + "\n");
  ASSERT_EQ(chmod(header.c_str(), 0600), 0);
  const std::string unread = CurlAsNobody(port, "/api/jobs", header);
  EXPECT_THAT(unread, ::testing::Not(HasSubstr("secret"))) << unread;
  EXPECT_THAT(unread, ::testing::Not(::testing::EndsWith("\n200"))) << unread;
  // Given to nobody (as --viewer-group gives it to a group), it opens the listener.
  ASSERT_EQ(chmod(header.c_str(), 0644), 0);
  const std::string jobs = CurlAsNobody(port, "/api/jobs", header);
  EXPECT_THAT(jobs, HasSubstr("secret-job"));
  EXPECT_THAT(jobs, ::testing::EndsWith("\n200"));
}

TEST(Metrics, WithoutTheTokenAScrapeIs401UnlessInspectionIsOpen) {
  ZerodHarness closed;
  const int closed_port = StartWithHttp(closed);
  ASSERT_GT(closed_port, 0);
  httplib::Client client("127.0.0.1", closed_port);
  auto refused = client.Get("/metrics");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(refused->get_header_value("WWW-Authenticate"), "Bearer realm=\"zerod\"");
  EXPECT_THAT(refused->body, HasSubstr("needs the viewer token"));
  auto wrong = client.Get("/metrics", {{"Authorization", "Bearer not-the-token"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  // The admin token serves as well.
  const std::string admin(absl::StripAsciiWhitespace(ReadFile(closed.data_dir() + "/admin.token")));
  auto as_admin = client.Get("/metrics", {{"Authorization", "Bearer " + admin}});
  ASSERT_TRUE(as_admin);
  EXPECT_EQ(as_admin->status, 200);

  ZerodHarness open({"--open-inspection"});
  const int open_port = StartWithHttp(open);
  ASSERT_GT(open_port, 0);
  httplib::Client anyone("127.0.0.1", open_port);
  auto scraped = anyone.Get("/metrics");
  ASSERT_TRUE(scraped);
  EXPECT_EQ(scraped->status, 200);
  EXPECT_THAT(scraped->body, HasSubstr("zerod_jobs"));
}

TEST(Metrics, ABadHttpAddressIsAUsageErrorAndAPortInUseFailsTheStart) {
  ZerodHarness zerod;
  const ProcessResult bad = zerod.StartRefused({"--http-listen", "localhost"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  // One line, before anything started.
  EXPECT_EQ(bad.out,
            "zerod: --http-listen: HTTP listen address 'localhost': no port (expected HOST:PORT, "
            "[IPV6]:PORT or :PORT)\n");

  ZerodHarness first;
  const int taken = StartWithHttp(first);
  ASSERT_GT(taken, 0);
  const ProcessResult in_use =
      zerod.StartRefused({"--http-listen", absl::StrCat("127.0.0.1:", taken)});
  EXPECT_EQ(in_use.exit_code, 1) << in_use.out;
  EXPECT_THAT(in_use.out, HasSubstr(absl::StrCat("cannot listen for HTTP on 127.0.0.1:", taken)));
}

}  // namespace
}  // namespace zerod::testing
