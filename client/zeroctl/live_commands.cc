#include "client/zeroctl/live_commands.h"

#include <cctype>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/coordinator_client.h"
#include "client/credentials.h"
#include "nlohmann/json.hpp"
#include "proto/plan_convert.h"
#include "runtime/common/units.h"

namespace zerod::zeroctl {
namespace {

using client::CoordinatorClient;
using nlohmann::json;

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string JobStateName(v1::JobState s) {
  return s == v1::JOB_STATE_UNSPECIFIED ? "unknown" : Lower(v1::JobState_Name(s).substr(4));
}
std::string MemberStateName(v1::MemberState s) {
  return s == v1::MEMBER_STATE_UNSPECIFIED ? "unknown" : Lower(v1::MemberState_Name(s).substr(7));
}
std::string EventName(v1::JobEvent::Kind k) { return Lower(v1::JobEvent::Kind_Name(k)); }
std::string CheckpointStateName(v1::CheckpointState s) {
  return s == v1::CHECKPOINT_STATE_UNSPECIFIED ? "unknown"
                                               : Lower(v1::CheckpointState_Name(s).substr(11));
}

std::string Ago(int64_t unix_ms) {
  if (unix_ms == 0) return "never";
  const double seconds = static_cast<double>(absl::ToUnixMillis(absl::Now()) - unix_ms) / 1000.0;
  return absl::StrFormat("%.1fs ago", seconds);
}

// A server error: one line, exit 1.
int ServerError(std::ostream& err, const absl::Status& status) {
  err << "zeroctl: " << status.message() << "\n";
  return 1;
}

int UsageError(std::ostream& err, const std::string& message) {
  err << "zeroctl: " << message << "\n";
  return 2;
}

int Jobs(CoordinatorClient& c, const LiveFlags& f, std::ostream& out, std::ostream& err) {
  auto jobs = c.ListJobs();
  if (!jobs.ok()) return ServerError(err, jobs.status());
  if (f.json) {
    json list = json::array();
    for (const v1::JobSummary& j : jobs->jobs()) {
      list.push_back({{"job_id", j.job_id()},
                      {"state", JobStateName(j.state())},
                      {"world_size", j.world_size()},
                      {"active_members", j.active_members()},
                      {"generation", j.generation()},
                      {"stage", j.stage()},
                      {"params", j.params()}});
    }
    out << json{{"jobs", list}}.dump() << "\n";
    return 0;
  }
  out << absl::StrFormat("%-24s %-9s %9s %5s %6s %10s\n", "JOB", "STATE", "ACTIVE", "GEN", "STAGE",
                         "PARAMS");
  for (const v1::JobSummary& j : jobs->jobs()) {
    out << absl::StrFormat("%-24s %-9s %9s %5d %6s %10s\n", j.job_id(), JobStateName(j.state()),
                           absl::StrCat(j.active_members(), "/", j.world_size()), j.generation(),
                           j.stage() < 0 ? "-" : absl::StrCat(j.stage()),
                           j.params() ? FormatCount(j.params()) : "-");
  }
  return 0;
}

int Members(CoordinatorClient& c, const LiveFlags& f, std::ostream& out, std::ostream& err) {
  auto d = c.DescribeJob(f.job);
  if (!d.ok()) return ServerError(err, d.status());
  if (f.json) {
    json members = json::array();
    for (const v1::Member& m : d->members()) {
      members.push_back({{"rank", m.rank()},
                         {"state", MemberStateName(m.state())},
                         {"host", m.host()},
                         {"device", m.device()},
                         {"step", m.step()},
                         {"generation", m.generation()},
                         {"budget_bytes", m.budget_bytes()},
                         {"last_heartbeat_unix_ms", m.last_heartbeat_unix_ms()}});
    }
    out << json{{"job_id", f.job},
                {"state", JobStateName(d->summary().state())},
                {"generation", d->summary().generation()},
                {"world_size", d->summary().world_size()},
                {"lease_ttl_ms", d->lease_ttl_ms()},
                {"members", members}}
               .dump()
        << "\n";
    return 0;
  }
  out << absl::StrFormat("job %s: %s, generation %d, %d of %d ranks active, lease %s\n", f.job,
                         JobStateName(d->summary().state()), d->summary().generation(),
                         d->summary().active_members(), d->summary().world_size(),
                         absl::FormatDuration(absl::Milliseconds(d->lease_ttl_ms())));
  out << absl::StrFormat("%-6s %-8s %-20s %-8s %8s %-16s %s\n", "RANK", "STATE", "HOST", "DEVICE",
                         "STEP", "LAST HEARTBEAT", "BUDGET");
  for (const v1::Member& m : d->members()) {
    out << absl::StrFormat(
        "%-6d %-8s %-20s %-8s %8d %-16s %s\n", m.rank(), MemberStateName(m.state()), m.host(),
        m.device(), m.step(), Ago(m.last_heartbeat_unix_ms()),
        m.budget_bytes() ? FormatBytes(static_cast<double>(m.budget_bytes())) : "-");
  }
  return 0;
}

int Shards(CoordinatorClient& c, const LiveFlags& f, std::ostream& out, std::ostream& err) {
  int64_t rank = -1;
  if (!f.rank.empty() && (!absl::SimpleAtoi(f.rank, &rank) || rank < 0)) {
    return UsageError(err, absl::StrCat("--rank: expected a rank (0 or more), got '", f.rank, "'"));
  }
  auto map = c.ShardMap(f.job, rank, f.tensor);
  if (!map.ok()) return ServerError(err, map.status());
  if (f.json) {
    json ranks = json::array();
    for (const v1::RankShard& r : map->ranks()) {
      json ranges = json::array();
      for (const v1::OwnedRange& o : r.ranges()) {
        ranges.push_back({{"segment", o.segment()},
                          {"flat_offset", o.flat_offset()},
                          {"shard_offset", o.shard_offset()},
                          {"numel", o.numel()},
                          {"real_numel", o.real_numel()}});
      }
      json entry = {
          {"rank", r.rank()}, {"shard_numel", r.shard_numel()}, {"real_numel", r.real_numel()}};
      if (rank >= 0) entry["ranges"] = ranges;
      ranks.push_back(entry);
    }
    json doc = {{"job_id", map->job_id()},
                {"plan_digest", map->plan_digest()},
                {"stage", map->stage()},
                {"world_size", map->world_size()},
                {"padded_numel", map->padded_numel()},
                {"shard_numel", map->shard_numel()},
                {"segments", map->segments()},
                {"ranks", ranks}};
    if (!f.tensor.empty()) {
      json pieces = json::array();
      for (const v1::Piece& p : map->pieces()) {
        pieces.push_back({{"owner_rank", p.owner_rank()},
                          {"shard_offset", p.shard_offset()},
                          {"tensor_offset", p.tensor_offset()},
                          {"numel", p.numel()}});
      }
      doc["tensor"] = f.tensor;
      doc["pieces"] = pieces;
    }
    out << doc.dump() << "\n";
    return 0;
  }
  out << absl::StrFormat(
      "job %s: stage %d over %d ranks, plan digest %s\n"
      "flat buffer %d elements in %d segments; every shard %d elements\n",
      map->job_id(), map->stage(), map->world_size(), map->plan_digest(), map->padded_numel(),
      map->segments(), map->shard_numel());
  out << absl::StrFormat("%-6s %14s %14s %8s\n", "RANK", "SHARD NUMEL", "REAL NUMEL", "PADDING");
  for (const v1::RankShard& r : map->ranks()) {
    out << absl::StrFormat("%-6d %14d %14d %8d\n", r.rank(), r.shard_numel(), r.real_numel(),
                           r.shard_numel() - r.real_numel());
    if (rank >= 0) {
      out << absl::StrFormat("  %-8s %14s %14s %10s %10s\n", "SEGMENT", "FLAT OFFSET",
                             "SHARD OFFSET", "NUMEL", "REAL");
      for (const v1::OwnedRange& o : r.ranges()) {
        out << absl::StrFormat("  %-8d %14d %14d %10d %10d\n", o.segment(), o.flat_offset(),
                               o.shard_offset(), o.numel(), o.real_numel());
      }
    }
  }
  if (!f.tensor.empty()) {
    out << absl::StrFormat("tensor %s: %d pieces\n", f.tensor, map->pieces_size());
    out << absl::StrFormat("  %-6s %14s %14s %10s\n", "OWNER", "SHARD OFFSET", "TENSOR OFFSET",
                           "NUMEL");
    for (const v1::Piece& p : map->pieces()) {
      out << absl::StrFormat("  %-6s %14d %14d %10d\n",
                             p.owner_rank() < 0 ? "all" : absl::StrCat(p.owner_rank()),
                             p.shard_offset(), p.tensor_offset(), p.numel());
    }
  }
  return 0;
}

int Memory(CoordinatorClient& c, const LiveFlags& f, std::ostream& out, std::ostream& err) {
  auto d = c.DescribeJob(f.job);
  if (!d.ok()) return ServerError(err, d.status());
  auto inputs = c.GetPlan(f.job);
  if (!inputs.ok()) return ServerError(err, inputs.status());
  auto plan = rpc::PlanFromInputs(*inputs);
  if (!plan.ok()) return ServerError(err, plan.status());
  json ranks = json::array();
  if (!f.json) {
    out << absl::StrFormat("job %s: stage %d, plan %s allocates %s per rank (paper formula %s)\n",
                           f.job, plan->stage(), plan->DigestHex(),
                           FormatBytes(static_cast<double>(plan->AllocatedBytesPerRank())),
                           FormatBytes(plan->PaperModelStateBytes()));
    out << absl::StrFormat("%-6s %-16s %14s %14s\n", "RANK", "CATEGORY", "PLAN", "REPORTED");
  }
  for (const v1::Member& m : d->members()) {
    const plan::MemoryBreakdown expected = plan->MemoryForRank(m.rank());
    json plan_json = json::object(), reported_json = json::object();
    int64_t reported_total = 0;
    for (int k = 0; k < plan::kMemoryCategoryCount; ++k) {
      const auto cat = static_cast<plan::MemoryCategory>(k);
      const std::string name(plan::MemoryCategoryName(cat));
      plan_json[name] = expected[cat];
      const auto it = m.memory_bytes().find(name);
      const bool has = it != m.memory_bytes().end();
      if (has) {
        reported_json[name] = it->second;
        reported_total += it->second;
      }
      if (!f.json && (expected[cat] != 0 || (has && it->second != 0))) {
        out << absl::StrFormat("%-6s %-16s %14s %14s\n", k == 0 ? absl::StrCat(m.rank()) : "", name,
                               FormatBytes(static_cast<double>(expected[cat])),
                               has ? FormatBytes(static_cast<double>(it->second)) : "-");
      }
    }
    if (!f.json) {
      out << absl::StrFormat(
          "%-6s %-16s %14s %14s\n", "", "total", FormatBytes(static_cast<double>(expected.Total())),
          m.memory_bytes().empty() ? "-" : FormatBytes(static_cast<double>(reported_total)));
    }
    ranks.push_back({{"rank", m.rank()},
                     {"state", MemberStateName(m.state())},
                     {"plan", plan_json},
                     {"reported", reported_json},
                     {"plan_total_bytes", expected.Total()},
                     {"reported_total_bytes", reported_total}});
  }
  if (f.json) {
    out << json{{"job_id", f.job},
                {"plan_digest", plan->DigestHex()},
                {"stage", plan->stage()},
                {"allocated_bytes_per_rank", plan->AllocatedBytesPerRank()},
                {"paper_model_state_bytes", std::llround(plan->PaperModelStateBytes())},
                {"ranks", ranks}}
               .dump()
        << "\n";
  }
  return 0;
}

int Watch(CoordinatorClient& c, const LiveFlags& f, std::ostream& out, std::ostream& err) {
  absl::Status s = c.Watch(f.job, [&](const v1::JobEvent& e) {
    if (f.json) {
      out << json{{"kind", EventName(e.kind())},
                  {"job_id", e.job_id()},
                  {"generation", e.generation()},
                  {"state", JobStateName(e.job_state())},
                  {"rank", e.rank()},
                  {"step", e.step()},
                  {"message", e.message()},
                  {"unix_ms", e.unix_ms()}}
                 .dump()
          << std::endl;
    } else {
      out << absl::FormatTime("%H:%M:%E3S", absl::FromUnixMillis(e.unix_ms()),
                              absl::LocalTimeZone())
          << " " << EventName(e.kind()) << " job " << e.job_id() << " gen " << e.generation()
          << " (" << JobStateName(e.job_state()) << ")";
      if (e.rank() >= 0) out << " rank " << e.rank();
      if (e.kind() == v1::JobEvent::STEP) out << " step " << e.step();
      if (!e.message().empty()) out << ": " << e.message();
      out << std::endl;
    }
    return e.kind() != v1::JobEvent::JOB_ENDED;
  });
  if (!s.ok()) return ServerError(err, s);
  return 0;
}

// A path as one table cell: a control character in it would break the one line per checkpoint.
std::string OneLinePath(std::string path) {
  for (char& c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return path;
}

int Checkpoints(CoordinatorClient& c, const LiveFlags& f, std::ostream& out, std::ostream& err) {
  auto records = c.ListCheckpoints(f.job);
  if (!records.ok()) {
    // Naming a job that is not there (or no job at all) is the user's mistake, not the server's.
    const absl::StatusCode code = records.status().code();
    if (code == absl::StatusCode::kNotFound || code == absl::StatusCode::kInvalidArgument) {
      return UsageError(err, std::string(records.status().message()));
    }
    return ServerError(err, records.status());
  }
  if (f.json) {
    json list = json::array();
    for (const v1::CheckpointRecord& r : *records) {
      list.push_back({{"step", r.step()},
                      {"state", CheckpointStateName(r.state())},
                      {"world_size", r.world_size()},
                      {"stage", r.stage()},
                      {"bytes", r.bytes()},
                      {"created_unix_ms", r.created_unix_ms()},
                      {"completed_unix_ms", r.completed_unix_ms()},
                      {"directory", r.directory()}});
    }
    out << json{{"job_id", f.job}, {"checkpoints", list}}.dump() << "\n";
    return 0;
  }
  if (records->empty()) {
    out << "no checkpoints for job " << f.job << "\n";
    return 0;
  }
  out << absl::StrFormat("%12s %-8s %6s %5s %10s %-19s %s\n", "STEP", "STATE", "WORLD", "STAGE",
                         "SIZE", "COMPLETED", "DIRECTORY");
  for (const v1::CheckpointRecord& r : *records) {
    const std::string completed =
        r.completed_unix_ms() == 0
            ? "-"
            : absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(r.completed_unix_ms()),
                               absl::LocalTimeZone());
    out << absl::StrFormat("%12d %-8s %6d %5d %10s %-19s %s\n", r.step(),
                           CheckpointStateName(r.state()), r.world_size(), r.stage(),
                           r.bytes() ? FormatBytes(static_cast<double>(r.bytes())) : "-", completed,
                           OneLinePath(r.directory()));
  }
  return 0;
}

int End(CoordinatorClient& c, const LiveFlags& f, std::ostream& out, std::ostream& err) {
  if (absl::Status s = c.EndJob(f.job); !s.ok()) return ServerError(err, s);
  out << "job " << f.job << " ended\n";
  return 0;
}

// The credentials `end` sends: the job's token (--token-file, else found as for any call) and the
// admin token when one is at hand. A missing file named by a flag is a usage error.
absl::Status EndCredentials(const LiveFlags& f, client::ClientOptions& options) {
  if (!f.token_file.empty()) {
    auto token = client::ReadTokenFile(f.token_file);
    if (!token.ok())
      return absl::InvalidArgumentError(absl::StrCat("--token-file: ", token.status().message()));
    options.job_token = *token;
  }
  std::string admin_file = f.admin_token_file;
  if (admin_file.empty() && std::getenv("ZEROD_ADMIN_TOKEN_FILE") != nullptr) {
    admin_file = std::getenv("ZEROD_ADMIN_TOKEN_FILE");
  }
  if (!admin_file.empty()) {
    auto token = client::ReadTokenFile(admin_file);
    if (!token.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("--admin-token-file: ", token.status().message()));
    options.admin_token = *token;
  } else if (auto token = client::ReadTokenFile("/var/lib/zerod/admin.token"); token.ok()) {
    options.admin_token = *token;  // root, or the daemon's user, on the daemon's node
  }
  return absl::OkStatus();
}

// The credentials the read-only commands send (over TCP they need one, over the Unix socket the
// daemon ignores them): the viewer token ($ZEROD_VIEWER_TOKEN_FILE, else the daemon's default when
// readable), else the admin token when at hand. A missing file named by the variable is a usage
// error.
absl::Status ViewCredentials(client::ClientOptions& options) {
  if (const char* file = std::getenv("ZEROD_VIEWER_TOKEN_FILE"); file != nullptr && *file) {
    auto token = client::ReadTokenFile(file);
    if (!token.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ZEROD_VIEWER_TOKEN_FILE: ", token.status().message()));
    }
    options.viewer_token = *token;
    return absl::OkStatus();
  }
  if (auto token = client::ReadTokenFile("/var/lib/zerod/viewer.token"); token.ok()) {
    options.viewer_token = *token;  // a member of the daemon's --viewer-group
    return absl::OkStatus();
  }
  if (const char* file = std::getenv("ZEROD_ADMIN_TOKEN_FILE"); file != nullptr && *file) {
    if (auto token = client::ReadTokenFile(file); token.ok()) options.admin_token = *token;
  } else if (auto token = client::ReadTokenFile("/var/lib/zerod/admin.token"); token.ok()) {
    options.admin_token = *token;
  }
  return absl::OkStatus();
}

}  // namespace

void AddGlobalFlags(CLI::App& cmd, LiveFlags& f) {
  cmd.add_option("--endpoint", f.endpoint,
                 "zerod address: unix:///run/zerod/zerod.sock or host:port "
                 "(default: $ZEROD_ENDPOINT)");
  cmd.add_flag("--json", f.json, "JSON instead of a table");
  cmd.add_option("--timeout", f.timeout, "Per-call deadline, retries included")
      ->capture_default_str();
}

std::vector<CLI::App*> AddLiveCommands(CLI::App& app, LiveFlags& f) {
  std::vector<CLI::App*> commands;
  auto common = [&f](CLI::App* cmd, bool needs_job) {
    AddGlobalFlags(*cmd, f);  // each subcommand takes them after its name too
    if (needs_job) cmd->add_option("JOB", f.job, "Job id")->required();
    return cmd;
  };
  commands.push_back(common(app.add_subcommand("jobs", "List jobs"), false));
  commands.push_back(common(app.add_subcommand("members", "Members of a job"), true));
  CLI::App* shards = common(app.add_subcommand("shards", "Shard map of a job"), true);
  shards->add_option("--rank", f.rank, "Show this rank's ranges");
  shards->add_option("--tensor", f.tensor, "Show this tensor's pieces");
  commands.push_back(shards);
  commands.push_back(common(
      app.add_subcommand("memory", "Memory per rank: the plan against what ranks report"), true));
  commands.push_back(
      common(app.add_subcommand("watch", "Membership and step events as they happen"), true));
  commands.push_back(common(
      app.add_subcommand("checkpoints", "A job's checkpoints as zerod recorded them"), true));
  CLI::App* end =
      common(app.add_subcommand("end",
                                "End a job (its owner or an admin): its ranks' calls fail, its "
                                "Store keys are deleted"),
             true);
  end->add_option("--token-file", f.token_file,
                  "The job's token (default: $ZEROD_JOB_TOKEN, else the one zerorun saved in "
                  "~/.config/zerod/jobs/)");
  end->add_option("--admin-token-file", f.admin_token_file,
                  "The daemon's admin token (default: $ZEROD_ADMIN_TOKEN_FILE, else "
                  "/var/lib/zerod/admin.token when readable)");
  commands.push_back(end);
  return commands;
}

int RunLive(const std::string& command, const LiveFlags& f, std::ostream& out, std::ostream& err) {
  absl::Duration timeout;
  if (!absl::ParseDuration(f.timeout, &timeout) || timeout <= absl::ZeroDuration()) {
    return UsageError(
        err, absl::StrCat("--timeout: expected a duration like 10s, got '", f.timeout, "'"));
  }
  client::ClientOptions options;
  options.endpoint = f.endpoint;
  options.call_timeout = timeout;
  options.retry_for = timeout;
  if (absl::Status s = command == "end" ? EndCredentials(f, options) : ViewCredentials(options);
      !s.ok()) {
    return UsageError(err, std::string(s.message()));
  }
  auto c = CoordinatorClient::Connect(options);
  if (!c.ok()) return UsageError(err, std::string(c.status().message()));
  if (command == "jobs") return Jobs(**c, f, out, err);
  if (command == "members") return Members(**c, f, out, err);
  if (command == "shards") return Shards(**c, f, out, err);
  if (command == "memory") return Memory(**c, f, out, err);
  if (command == "watch") return Watch(**c, f, out, err);
  if (command == "checkpoints") return Checkpoints(**c, f, out, err);
  if (command == "end") return End(**c, f, out, err);
  return UsageError(err, "unknown command " + command);
}

}  // namespace zerod::zeroctl
