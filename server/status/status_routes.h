#ifndef ZEROD_SERVER_STATUS_STATUS_ROUTES_H_
#define ZEROD_SERVER_STATUS_STATUS_ROUTES_H_

// The status page on zerod's HTTP listener:
//   /                    the page (page.html, embedded at build time), which polls the two below
//   /api/jobs            every job (status_views.h JobsView)
//   /api/jobs/<id>       one job (JobView); also /api/jobs/?id=<id>, which the page uses because a
//                        browser resolves a job named "." or ".." out of a path
// A job the registry does not hold is 404 with {"error": "..."}; any other path under / is 404.

#include "server/checkpoint_records.h"
#include "server/http/http_server.h"
#include "server/job_registry.h"
#include "server/status/job_history.h"

namespace zerod::status {

// Adds the routes. Everything passed must outlive the server's handlers (stop the server first);
// `checkpoints` may be null (no checkpoints listed).
void RegisterStatusRoutes(http::HttpServer& server, const server::JobRegistry* registry,
                          const server::CheckpointRecords* checkpoints, const JobHistory* history);

}  // namespace zerod::status

#endif  // ZEROD_SERVER_STATUS_STATUS_ROUTES_H_
