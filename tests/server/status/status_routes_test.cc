// The status routes through HttpServer::Dispatch (what a connection gets, without a socket), and
// what the embedded page may and may not contain.

#include "server/status/status_routes.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "server/status/page_html.h"
#include "tests/server/status/running_job.h"

namespace zerod::status {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

class StatusRoutesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(env_.Form("llama", 2));
    RegisterStatusRoutes(server_, &env_.registry(), &env_.checkpoints(), &history_);
  }

  http::Response Get(const std::string& path, const std::string& query = "") {
    return server_.Dispatch(http::Request{"GET", path, query});
  }

  RunningJob env_;
  JobHistory history_;
  http::HttpServer server_;
};

TEST_F(StatusRoutesTest, TheRootIsThePage) {
  const http::Response page = Get("/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_EQ(page.body, StatusPageHtml());
  EXPECT_THAT(page.body, StartsWith("<!DOCTYPE html>"));
}

TEST_F(StatusRoutesTest, APathNoRouteCoversIsNotFoundNotThePage) {
  const http::Response r = Get("/favicon.ico");
  EXPECT_EQ(r.status, 404);
  EXPECT_THAT(r.body, Not(HasSubstr("<html")));
}

TEST_F(StatusRoutesTest, JobsAreJson) {
  const http::Response r = Get("/api/jobs");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "application/json");
  const json view = json::parse(r.body);
  ASSERT_EQ(view["jobs"].size(), 1u);
  EXPECT_EQ(view["jobs"][0]["job_id"], "llama");
}

TEST_F(StatusRoutesTest, AJobIsFoundByPathOrByQuery) {
  for (const auto& [path, query] : {std::pair<std::string, std::string>{"/api/jobs/llama", ""},
                                    {"/api/jobs/", "id=llama"},
                                    {"/api/jobs/", "x=1&id=%6Clama"}}) {
    const http::Response r = Get(path, query);
    ASSERT_EQ(r.status, 200) << path << "?" << query << ": " << r.body;
    EXPECT_EQ(json::parse(r.body)["job"]["job_id"], "llama") << path << "?" << query;
  }
}

TEST_F(StatusRoutesTest, AnUnknownJobIsNotFoundAsJsonNamingIt) {
  const http::Response r = Get("/api/jobs/", "id=..");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_THAT(json::parse(r.body)["error"].get<std::string>(), HasSubstr("job .."));
  const http::Response none = Get("/api/jobs/");
  EXPECT_EQ(none.status, 400);
  EXPECT_THAT(json::parse(none.body)["error"].get<std::string>(), HasSubstr("no job named"));
}

// The browser may reach nothing but zerod, and job ids, hosts, devices and directories come from
// ranks: the page loads nothing from elsewhere and never turns data into markup.
TEST(StatusPage, LoadsNothingFromElsewhereAndNeverParsesDataAsMarkup) {
  const std::string page(StatusPageHtml());
  for (const char* banned : {"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write",
                             "eval(", "new Function", "src=\"http", "href=\"http", "@import"}) {
    EXPECT_THAT(page, Not(HasSubstr(banned))) << banned;
  }
  // The one URL in it is SVG's namespace, which is a name, not a fetch.
  size_t at = 0, urls = 0;
  while ((at = page.find("http", at)) != std::string::npos) {
    if (page.compare(at, 7, "http://") == 0 || page.compare(at, 8, "https://") == 0) {
      EXPECT_EQ(page.compare(at, 26, "http://www.w3.org/2000/svg"), 0) << page.substr(at, 40);
      ++urls;
    }
    ++at;
  }
  EXPECT_EQ(urls, 1u);
  EXPECT_THAT(page, HasSubstr("Content-Security-Policy"));
}

}  // namespace
}  // namespace zerod::status
