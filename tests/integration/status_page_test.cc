// The status page in a real headless Chromium, against a real zerod (--http-listen) with real
// train_mlp ranks: opened once with ?token=<viewer token>, it lands on / without the token and
// goes on with the cookie zerod set (which the page's scripts cannot read); it loads with no
// console error, shows the running job's ranks, their steps
// advance on the same page (no reload), its charts, bars and shard map fill in, and markup in a
// rank's host is shown as text. Writes a screenshot into the build folder for a person to look at.

#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/plan/synthetic_layout.h"
#include "tests/integration/headless_chromium.h"
#include "tests/integration/zerod_harness.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::IsEmpty;

// Every wait is bounded generously: the machine may be loaded with sanitizer builds beside this
// one, and Chromium's first start alone can take seconds there.
const absl::Duration kWait = Scaled(absl::Seconds(90));

// The members table as the page shows it: [{rank, state, step}].
constexpr char kMembers[] = R"js(
  Array.from(document.querySelectorAll("#members tbody tr")).map((tr) => ({
    rank: Number(tr.dataset.rank), state: tr.children[1].textContent,
    step: Number(tr.querySelector(".step").textContent)}))
)js";

// Evaluates `expression` until `done` holds of its value or kWait passes; returns the last value.
template <typename Predicate>
json EvaluateUntil(HeadlessChromium& browser, const std::string& expression, Predicate done) {
  json value;
  const absl::Time deadline = absl::Now() + kWait;
  do {
    absl::StatusOr<json> v = browser.Evaluate(expression, kWait);
    EXPECT_TRUE(v.ok()) << v.status();
    if (!v.ok()) return json();
    value = *v;
    if (done(value)) return value;
    absl::SleepFor(absl::Milliseconds(250));
  } while (absl::Now() < deadline);
  return value;
}

std::string ReadPort(const std::string& path) {
  std::string port;
  Eventually(
      [&] {
        std::ifstream in(path);
        std::getline(in, port);
        return !port.empty();
      },
      absl::Seconds(30));
  return port;
}

std::string Join(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& line : lines) out += line + "\n";
  return out;
}

TEST(StatusPage, ShowsARunningJobsRanksAdvancingLiveWithNoConsoleError) {
  const std::string chromium = HeadlessChromium::Find();
  if (chromium.empty()) {
    GTEST_SKIP() << "chromium is not installed (apt-get install chromium; scripts/setup.sh): the "
                    "status page is not tested in a browser";
  }
  ZerodHarness zerod;
  const std::string port_file = zerod.dir().path() + "/http.port";
  ASSERT_NO_FATAL_FAILURE(
      zerod.Start({"--http-listen", "127.0.0.1:0", "--http-port-file", port_file}));
  const std::string port = ReadPort(port_file);
  ASSERT_FALSE(port.empty()) << "zerod wrote no HTTP port to " << port_file << "\n" << zerod.Log();

  // Two real ranks training for as long as the test runs (killed when it ends), saving checkpoints.
  const std::string job = "status-page";
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{Built(TRAIN_MLP_PATH), "--stage", "2", "--steps", "100000000",
                                 "--checkpoint-dir", zerod.dir().path() + "/checkpoints",
                                 "--checkpoint-every", "200", "--keep-last", "2"},
        zerod.dir().path() + "/rank" + std::to_string(r) + ".log",
        std::vector<std::string>{"ZEROD_ENDPOINT=" + zerod.endpoint(), "ZEROD_JOB=" + job,
                                 "ZEROD_RANK=" + std::to_string(r), "ZEROD_WORLD_SIZE=2"}));
  }
  // And a job whose rank's host and device are markup: the page must show them as text.
  const std::string hostile_host = "<img src=x onerror=\"window.pwned=1\">";
  const std::string hostile_device = "<script>window.pwned=2</script>";
  auto client = zerod.Client();
  client::JoinOptions hostile;
  hostile.job_id = "hostile";
  hostile.rank = 0;
  hostile.host = hostile_host;
  hostile.device = hostile_device;
  hostile.layout = plan::SyntheticLayout(1 << 12, DType::kBFloat16, 4);
  hostile.plan_options.stage = 1;
  ASSERT_TRUE(client->Join(hostile, Scaled(absl::Seconds(30))).ok());

  auto browser = HeadlessChromium::Start(chromium, zerod.dir().path() + "/chromium-profile",
                                         zerod.dir().path() + "/chromium.log");
  ASSERT_TRUE(browser.ok()) << browser.status();
  HeadlessChromium& page = **browser;
  // As a person opens it: the viewer token in the address once (with the job to look at). zerod
  // answers with a cookie and sends the browser on to the page without the token, keeping the
  // fragment.
  std::ifstream token_file(zerod.data_dir() + "/viewer.token");
  std::string token;
  std::getline(token_file, token);
  ASSERT_FALSE(token.empty());
  const std::string base = absl::StrCat("http://127.0.0.1:", port, "/");
  ASSERT_TRUE(page.Open(absl::StrCat(base, "?token=", token, "#job=", job), kWait).ok());
  const absl::StatusOr<json> landed = page.Evaluate(
      "({href: location.href, cookie: document.cookie, title: document.title})", kWait);
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_EQ((*landed)["href"], absl::StrCat(base, "#job=", job)) << "the token left the address";
  EXPECT_EQ((*landed)["title"], "zerod status") << "the page, not the form asking for a token";
  EXPECT_EQ((*landed)["cookie"], "") << "the cookie is HttpOnly: no script reads the token";

  // First look: both ranks, active, stepping.
  const json first = EvaluateUntil(page, kMembers, [](const json& rows) {
    return rows.size() == 2 && rows[0]["step"] > 0 && rows[1]["step"] > 0;
  });
  ASSERT_EQ(first.size(), 2u) << first.dump() << "\n" << ranks[0]->Output();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(first[r]["rank"], r);
    EXPECT_EQ(first[r]["state"], "active");
    EXPECT_GT(first[r]["step"], 0) << ranks[r]->Output();
  }
  // A mark on this page: a reload would wipe it.
  ASSERT_TRUE(page.Evaluate("window.zerodTestMark = 'same page'", kWait).ok());
  // Second look: every rank's step moved on, on the same page.
  const json second = EvaluateUntil(page, kMembers, [&first](const json& rows) {
    return rows.size() == 2 && rows[0]["step"] > first[0]["step"] &&
           rows[1]["step"] > first[1]["step"];
  });
  ASSERT_EQ(second.size(), 2u) << second.dump();
  for (int r = 0; r < 2; ++r) {
    EXPECT_GT(second[r]["step"], first[r]["step"]) << "rank " << r << " did not advance";
  }
  EXPECT_EQ(*page.Evaluate("window.zerodTestMark", kWait), "same page") << "the page reloaded";

  // The rest fills in: memory bars for both ranks, the shard map, both charts, checkpoints.
  const json filled = EvaluateUntil(page, R"js(({
      bars: document.querySelectorAll("#memory .bar-row").length,
      slices: document.querySelectorAll("#shards rect").length,
      shardRanks: document.querySelectorAll("#shard-ranks tbody tr").length,
      ratePoints: Math.max(0, ...Array.from(document.querySelectorAll("#chart-rate polyline"),
                                           (l) => l.points.numberOfItems)),
      bytesPoints: Math.max(0, ...Array.from(document.querySelectorAll("#chart-bytes polyline"),
                                            (l) => l.points.numberOfItems)),
      checkpoints: document.querySelectorAll("#checkpoints tbody tr").length,
      jobs: document.querySelectorAll("#jobs tbody tr").length}))js",
                                    [](const json& v) {
                                      return v["bars"] == 2 && v["ratePoints"] >= 3 &&
                                             v["bytesPoints"] >= 3 && v["checkpoints"] > 0;
                                    });
  EXPECT_EQ(filled["bars"], 2) << filled.dump();
  EXPECT_GT(filled["slices"], 0) << filled.dump();
  EXPECT_EQ(filled["shardRanks"], 2) << filled.dump();
  // Lines of at least three samples (the sampler takes one a second).
  EXPECT_GE(filled["ratePoints"], 3) << filled.dump();
  EXPECT_GE(filled["bytesPoints"], 3) << filled.dump();
  EXPECT_GT(filled["checkpoints"], 0) << filled.dump();
  EXPECT_EQ(filled["jobs"], 2) << filled.dump();

  const std::string screenshot = Built(std::string(ZEROD_TEST_BUILT_IN) + "/tests/status_page.png");
  const absl::Status shot = page.Screenshot(screenshot, kWait);
  EXPECT_TRUE(shot.ok()) << shot;
  std::cout << "status page screenshot: " << screenshot << std::endl;

  // The hostile job, chosen as a person would (the hash), shows its markup as text and runs none.
  ASSERT_TRUE(page.Evaluate("location.hash = '#job=hostile'", kWait).ok());
  const json shown = EvaluateUntil(page, R"js(({
      title: document.getElementById("job-title").textContent,
      host: document.querySelector("#members tbody tr td:nth-child(3)")?.textContent,
      device: document.querySelector("#members tbody tr td:nth-child(4)")?.textContent,
      elements: document.querySelectorAll("#job img, #job script").length,
      pwned: window.pwned === undefined ? null : window.pwned}))js",
                                   [](const json& v) { return v["title"] == "Job hostile"; });
  EXPECT_EQ(shown["title"], "Job hostile") << shown.dump();
  EXPECT_EQ(shown["host"], hostile_host);
  EXPECT_EQ(shown["device"], hostile_device);
  EXPECT_EQ(shown["elements"], 0);
  EXPECT_TRUE(shown["pwned"].is_null()) << "markup from a rank ran in the page";

  EXPECT_THAT(page.errors(), IsEmpty()) << Join(page.errors());
}

}  // namespace
}  // namespace zerod::testing
