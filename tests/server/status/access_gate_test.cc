// The gate in front of zerod's HTTP listener, through HttpServer::Dispatch (what a connection gets,
// without a socket) with the real status routes and a real JobTokens deciding which tokens pass.

#include "server/status/access_gate.h"

#include <future>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth/job_tokens.h"
#include "server/auth/token_digest.h"
#include "server/state/sqlite_kv_store.h"
#include "server/status/page_html.h"
#include "server/status/status_routes.h"
#include "tests/server/status/running_job.h"
#include "tests/util/subprocess.h"

namespace zerod::status {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

std::string HeaderOf(const http::Response& r, const std::string& name) {
  for (const auto& [key, value] : r.headers) {
    if (absl::EqualsIgnoreCase(key, name)) return value;
  }
  return "";
}

class AccessGateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(env_.Form("llama", 2));
    kv_ = *server::SqliteKvStore::Open(dir_.path() + "/tokens.db", server::Durability::kNormal);
    tokens_ = std::make_unique<server::auth::JobTokens>(
        kv_.get(), [](const std::string&) { return false; },
        [](const std::string&) { return false; }, admin_,
        server::auth::ViewPolicy{.viewer_token = viewer_});
    std::promise<absl::Status> admitted;
    tokens_->Admit("llama", {.job_token = job_token_},
                   [&admitted](absl::Status s) { admitted.set_value(s); });
    ASSERT_TRUE(admitted.get_future().get().ok());
    server_.SetGate(AccessGate([tokens = tokens_.get()](absl::string_view token) {
      return tokens->IsViewerOrAdmin(token);
    }));
    server_.Route("/metrics", [](const http::Request&) {
      return http::Response{200, "text/plain", "zerod_jobs 1\n"};
    });
    RegisterStatusRoutes(server_, &env_.registry(), &env_.checkpoints(), &history_);
  }

  http::Response Get(const std::string& path, const std::string& query = "",
                     std::map<std::string, std::string> headers = {}) {
    return server_.Dispatch(http::Request{"GET", path, query, std::move(headers)});
  }
  http::Response WithBearer(const std::string& path, const std::string& token) {
    return Get(path, "", {{"authorization", "Bearer " + token}});
  }

  RunningJob env_;
  JobHistory history_;
  testing::TempDir dir_;
  std::unique_ptr<server::SqliteKvStore> kv_;
  const std::string admin_ = server::auth::NewToken();
  const std::string viewer_ = server::auth::NewToken();
  const std::string job_token_ = server::auth::NewToken();
  std::unique_ptr<server::auth::JobTokens> tokens_;
  http::HttpServer server_;
};

TEST_F(AccessGateTest, WithoutATokenEveryPathIs401WithABearerChallengeAndOneLineSayingWhatWould) {
  for (const char* path : {"/metrics", "/api/jobs", "/api/jobs/llama", "/nope"}) {
    SCOPED_TRACE(path);
    const http::Response r = Get(path);
    EXPECT_EQ(r.status, 401);
    EXPECT_EQ(HeaderOf(r, "WWW-Authenticate"), "Bearer realm=\"zerod\"");
    EXPECT_EQ(r.content_type, "text/plain; charset=utf-8");
    EXPECT_THAT(r.body, AllOf(HasSubstr("needs the viewer token (DATA_DIR/viewer.token) or the "
                                        "admin token"),
                              HasSubstr("Authorization: Bearer <token>"),
                              HasSubstr("/?token=<token>"), HasSubstr("--open-inspection")));
    EXPECT_EQ(std::count(r.body.begin(), r.body.end(), '\n'), 1) << r.body;
    EXPECT_THAT(r.body, Not(HasSubstr("llama")));
  }
  // Other methods too: a stranger learns nothing of what the listener serves.
  EXPECT_EQ(server_.Dispatch(http::Request{"POST", "/metrics", ""}).status, 401);
}

TEST_F(AccessGateTest, TheRootWithoutATokenIsASmallPageWithAFormForIt) {
  const http::Response r = Get("/");
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(HeaderOf(r, "WWW-Authenticate"), "Bearer realm=\"zerod\"");
  EXPECT_EQ(r.content_type, "text/html; charset=utf-8");
  EXPECT_THAT(r.body, StartsWith("<!DOCTYPE html>"));
  EXPECT_THAT(r.body, HasSubstr("<form method=\"get\" action=\"/\">"));
  EXPECT_THAT(r.body, HasSubstr("name=\"token\" type=\"password\""));
  EXPECT_THAT(r.body, HasSubstr("needs zerod's viewer token or its admin token"));
  EXPECT_NE(r.body, StatusPageHtml());
  EXPECT_THAT(HeaderOf(r, "Content-Security-Policy"), HasSubstr("default-src 'none'"));
}

TEST_F(AccessGateTest, TheViewerAndAdminTokensPassAsBearerAndAJobsOwnTokenDoesNot) {
  for (const std::string& token : {viewer_, admin_}) {
    EXPECT_EQ(WithBearer("/metrics", token).status, 200);
    EXPECT_EQ(WithBearer("/api/jobs", token).status, 200);
    EXPECT_EQ(WithBearer("/", token).body, StatusPageHtml());
  }
  // The scheme in any case, spaces around the token.
  EXPECT_EQ(Get("/metrics", "", {{"authorization", "bearer   " + viewer_ + " "}}).status, 200);
  // The page lists every job: the token of one is not enough, even for that job's view.
  const http::Response job = WithBearer("/api/jobs/llama", job_token_);
  EXPECT_EQ(job.status, 401);
  EXPECT_EQ(HeaderOf(job, "WWW-Authenticate"), "Bearer realm=\"zerod\", error=\"invalid_token\"");
}

TEST_F(AccessGateTest, AWrongTokenIs401InvalidTokenWithoutEchoingIt) {
  const std::string wrong = server::auth::NewToken();
  for (const char* path : {"/metrics", "/"}) {
    const http::Response r = WithBearer(path, wrong);
    EXPECT_EQ(r.status, 401);
    EXPECT_EQ(HeaderOf(r, "WWW-Authenticate"), "Bearer realm=\"zerod\", error=\"invalid_token\"");
    EXPECT_THAT(r.body, Not(HasSubstr(wrong)));
  }
  EXPECT_THAT(WithBearer("/metrics", wrong).body,
              StartsWith("the token presented is not accepted: "));
  EXPECT_THAT(WithBearer("/", wrong).body, HasSubstr("neither this zerod's viewer token"));
  // Another scheme is no token at all.
  EXPECT_EQ(Get("/metrics", "", {{"authorization", "Basic " + viewer_}}).status, 401);
}

TEST_F(AccessGateTest, ATokenInTheQuerySetsAnHttpOnlyStrictCookieAndRedirectsWithoutIt) {
  const http::Response login = Get("/", "token=" + viewer_);
  EXPECT_EQ(login.status, 303);
  EXPECT_EQ(HeaderOf(login, "Location"), "/");
  const std::string cookie = HeaderOf(login, "Set-Cookie");
  const std::string name = "zerod_token_" + server::auth::TokenDigest(viewer_).substr(0, 12);
  EXPECT_EQ(cookie, absl::StrCat(name, "=", viewer_, "; Path=/; HttpOnly; SameSite=Strict"));
  EXPECT_THAT(login.body, Not(HasSubstr(viewer_)));

  // The browser sends it back (among others): every route passes.
  const std::string sent = absl::StrCat("theme=dark; ", name, "=", viewer_, "; other=1");
  EXPECT_EQ(Get("/", "", {{"cookie", sent}}).body, StatusPageHtml());
  EXPECT_EQ(Get("/api/jobs", "", {{"cookie", sent}}).status, 200);
  EXPECT_EQ(Get("/metrics", "", {{"cookie", sent}}).status, 200);

  // Elsewhere the rest of the query stays, the token goes.
  const http::Response job = Get("/api/jobs/", "id=llama&token=" + admin_ + "&x=1");
  EXPECT_EQ(job.status, 303);
  EXPECT_EQ(HeaderOf(job, "Location"), "/api/jobs/?id=llama&x=1");
  EXPECT_THAT(HeaderOf(job, "Set-Cookie"), HasSubstr("=" + admin_ + ";"));
}

TEST_F(AccessGateTest, AWrongTokenInTheQuerySetsNoCookieAndShowsTheFormAgain) {
  const http::Response r = Get("/", "token=" + server::auth::NewToken());
  EXPECT_EQ(r.status, 401);
  EXPECT_THAT(HeaderOf(r, "Set-Cookie"), IsEmpty());
  EXPECT_THAT(r.body, HasSubstr("neither this zerod's viewer token nor its admin token"));
  EXPECT_THAT(r.body, HasSubstr("<form"));
  // An empty form is no token.
  EXPECT_THAT(Get("/", "token=").body, HasSubstr("needs zerod's viewer token"));
  // A job's token is not let in this way either.
  EXPECT_EQ(Get("/", "token=" + job_token_).status, 401);
}

TEST_F(AccessGateTest, TheRedirectAfterALoginStaysOnThisSiteAndCannotAddHeaders) {
  EXPECT_EQ(HeaderOf(Get("//evil.example", "token=" + viewer_), "Location"), "/");
  EXPECT_EQ(HeaderOf(Get("/a\r\nSet-Cookie: x=1", "token=" + viewer_), "Location"),
            "/a%0D%0ASet-Cookie%3A%20x%3D1");
  // A query that is not plain is dropped rather than passed on.
  EXPECT_EQ(HeaderOf(Get("/api/jobs/", "id=<x>&token=" + viewer_), "Location"), "/api/jobs/");
}

TEST_F(AccessGateTest, ACookieThatDoesNotPassIsIgnoredAndAnotherZerodsCookieIsLeftAlone) {
  const std::string other = server::auth::NewToken();
  const std::string ours = "zerod_token_" + server::auth::TokenDigest(viewer_).substr(0, 12);
  const std::string theirs = "zerod_token_" + server::auth::TokenDigest(other).substr(0, 12);
  // Only another zerod's cookie: refused as if nothing was presented.
  const http::Response refused = Get("/api/jobs", "", {{"cookie", theirs + "=" + other}});
  EXPECT_EQ(refused.status, 401);
  EXPECT_EQ(HeaderOf(refused, "WWW-Authenticate"), "Bearer realm=\"zerod\"");
  EXPECT_THAT(HeaderOf(refused, "Set-Cookie"), IsEmpty());
  // Both: ours passes.
  EXPECT_EQ(
      Get("/api/jobs", "", {{"cookie", absl::StrCat(theirs, "=", other, "; ", ours, "=", viewer_)}})
          .status,
      200);
  // A cookie of another name holding the token is not ours.
  EXPECT_EQ(Get("/api/jobs", "", {{"cookie", "token=" + viewer_}}).status, 401);
}

TEST(AccessGate, OpenInspectionLetsEveryRequestThrough) {
  EXPECT_FALSE(AccessGate(nullptr)) << "no gate at all";
  http::HttpServer server;
  server.SetGate(AccessGate(nullptr));
  server.Route("/metrics", [](const http::Request&) {
    return http::Response{200, "text/plain", "ok\n"};
  });
  EXPECT_EQ(server.Dispatch(http::Request{"GET", "/metrics", ""}).status, 200);
  EXPECT_EQ(server.Dispatch(http::Request{"GET", "/metrics", "token=x"}).status, 200);
}

}  // namespace
}  // namespace zerod::status
