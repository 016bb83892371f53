#include "server/status/status_routes.h"

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "server/http/query_string.h"
#include "server/status/page_html.h"
#include "server/status/status_views.h"

namespace zerod::status {
namespace {

constexpr char kJsonType[] = "application/json";
constexpr absl::string_view kJobPrefix = "/api/jobs/";

http::Response Json(int status, const nlohmann::json& body) {
  return http::Response{status, kJsonType, JsonText(body)};
}

http::Response Error(int status, std::string message) {
  return Json(status, {{"error", std::move(message)}});
}

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kInvalidArgument:
      return 400;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

}  // namespace

void RegisterStatusRoutes(http::HttpServer& server, const server::JobRegistry* registry,
                          const server::CheckpointRecords* checkpoints, const JobHistory* history) {
  // "/" is a prefix route: it also receives every path no other route covers.
  server.Route("/", [](const http::Request& request) {
    if (request.path != "/" && request.path != "/index.html") {
      return http::Response{404, "text/plain; charset=utf-8", "not found\n"};
    }
    return http::Response{200, "text/html; charset=utf-8", std::string(StatusPageHtml())};
  });
  server.Route("/api/jobs", [registry, history](const http::Request&) {
    return Json(200, JobsView(*registry, *history, absl::Now()));
  });
  server.Route(
      std::string(kJobPrefix), [registry, checkpoints, history](const http::Request& request) {
        std::string job_id = request.path.substr(std::min(request.path.size(), kJobPrefix.size()));
        if (job_id.empty()) job_id = http::QueryValue(request.query, "id").value_or("");
        if (job_id.empty())
          return Error(400, "no job named: use /api/jobs/<id> or /api/jobs/?id=<id>");
        absl::StatusOr<nlohmann::json> view =
            JobView(*registry, checkpoints, *history, job_id, absl::Now());
        if (!view.ok())
          return Error(HttpStatusOf(view.status().code()), std::string(view.status().message()));
        return Json(200, *view);
      });
}

}  // namespace zerod::status
