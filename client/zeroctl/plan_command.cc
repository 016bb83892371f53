#include "client/zeroctl/plan_command.h"

#include <memory>
#include <optional>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/layout_json.h"
#include "client/zeroctl/plan_report.h"
#include "runtime/common/status_macros.h"
#include "runtime/common/units.h"
#include "runtime/plan/synthetic_layout.h"

namespace zerod::zeroctl {
namespace {

using plan::PlanInput;
using plan::ShardPlan;

absl::Status FlagError(absl::string_view flag, const absl::Status& status) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", status.message()));
}

// Parses an optional count flag into `target`; `minimum` is its smallest legal value.
absl::Status ParseOptionalInt(absl::string_view flag, const std::string& text, int64_t minimum,
                              int64_t& target) {
  if (text.empty()) return absl::OkStatus();
  // ParseCount takes positive counts only; zero is legal for some flags.
  if (minimum == 0 && absl::StripAsciiWhitespace(text) == "0") {
    target = 0;
    return absl::OkStatus();
  }
  auto parsed = ParseCount(text);
  if (!parsed.ok()) return FlagError(flag, parsed.status());
  if (*parsed < minimum) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": must be at least ", minimum, ", got ", *parsed));
  }
  target = *parsed;
  return absl::OkStatus();
}

absl::Status ParseOptionalBytes(absl::string_view flag, const std::string& text, int64_t& target) {
  if (text.empty()) return absl::OkStatus();
  auto parsed = ParseBytes(text);
  if (!parsed.ok()) return FlagError(flag, parsed.status());
  target = *parsed;
  return absl::OkStatus();
}

absl::StatusOr<int> ParseStage(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  if (t == "auto") return plan::kAutoStage;
  if (t.size() == 1 && t[0] >= '0' && t[0] <= '3') return t[0] - '0';
  return absl::InvalidArgumentError(
      absl::StrCat("--stage: unknown stage '", text, "' (expected 0, 1, 2, 3 or auto)"));
}

absl::StatusOr<plan::Optimizer> ParseOptimizer(const std::string& text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "adam") return plan::Optimizer::kAdam;
  if (t == "adamw") return plan::Optimizer::kAdamW;
  return absl::InvalidArgumentError(
      absl::StrCat("--optimizer: unknown optimizer '", text, "' (expected adam or adamw)"));
}

struct ParsedFlags {
  PlanInput input;
  std::string source;
  std::optional<int> requested_stage;
};

absl::StatusOr<ParsedFlags> Parse(const PlanFlags& f) {
  ParsedFlags p;
  plan::PlanOptions& o = p.input.options;
  auto dtype = ParseDType(f.dtype);
  if (!dtype.ok()) return FlagError("--dtype", dtype.status());
  o.param_dtype = *dtype;
  o.grad_dtype = *dtype;
  if (!f.grad_dtype.empty()) {
    auto grad = ParseDType(f.grad_dtype);
    if (!grad.ok()) return FlagError("--grad-dtype", grad.status());
    o.grad_dtype = *grad;
  }
  ZEROD_ASSIGN_OR_RETURN(o.optimizer, ParseOptimizer(f.optimizer));
  if (f.dp.empty()) return absl::InvalidArgumentError("--dp is required (number of ranks)");
  ZEROD_RETURN_IF_ERROR(ParseOptionalInt("--dp", f.dp, 1, o.world_size));
  if (!f.stage.empty()) {
    ZEROD_ASSIGN_OR_RETURN(int stage, ParseStage(f.stage));
    p.requested_stage = stage;
  }
  if (!f.budget.empty()) {
    int64_t budget = 0;
    ZEROD_RETURN_IF_ERROR(ParseOptionalBytes("--budget", f.budget, budget));
    o.budget_bytes = budget;
  }
  ZEROD_RETURN_IF_ERROR(ParseOptionalBytes("--bucket", f.bucket, o.reduce_bucket_bytes));
  ZEROD_RETURN_IF_ERROR(ParseOptionalBytes("--unit", f.unit, o.gather_unit_bytes));
  ZEROD_RETURN_IF_ERROR(ParseOptionalInt("--prefetch", f.prefetch, 0, o.prefetch_depth));
  ZEROD_RETURN_IF_ERROR(
      ParseOptionalInt("--max-live-units", f.max_live_units, 1, o.max_live_units));
  if (!f.max_live_units.empty() && o.max_live_units < o.prefetch_depth + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-live-units: must be at least --prefetch + 1 (", o.prefetch_depth + 1,
                     "), got ", o.max_live_units));
  }
  if (!f.prefetch.empty() && f.max_live_units.empty()) {
    o.max_live_units = o.prefetch_depth + 1;
  }
  ZEROD_RETURN_IF_ERROR(
      ParseOptionalInt("--alignment", f.alignment, 1, o.partition_alignment_numel));

  if (f.params.empty() == f.layout.empty()) {
    return absl::InvalidArgumentError("give exactly one of --params N or --layout FILE.json");
  }
  if (!f.params.empty()) {
    auto params = ParseCount(f.params);
    if (!params.ok()) return FlagError("--params", params.status());
    p.input.tensors = plan::SyntheticLayout(*params, o.param_dtype);
    p.source = absl::StrCat("synthetic layout: ", p.input.tensors.size(), " tensors");
  } else {
    auto tensors = client::ReadLayoutFile(f.layout, o.param_dtype);
    if (!tensors.ok()) return absl::InvalidArgumentError(tensors.status().message());
    p.input.tensors = *std::move(tensors);
    p.source = absl::StrCat(f.layout, ": ", p.input.tensors.size(), " tensors");
  }
  ZEROD_RETURN_IF_ERROR(plan::ValidatePlanInput(p.input));
  return p;
}

absl::StatusOr<PlanReport> BuildReport(ParsedFlags parsed) {
  PlanReport report;
  report.source = parsed.source;
  report.budget_bytes = parsed.input.options.budget_bytes;
  auto layout = std::make_shared<const std::vector<plan::TensorSpec>>(parsed.input.tensors);
  for (int stage = 0; stage <= 3; ++stage) {
    ZEROD_ASSIGN_OR_RETURN(ShardPlan p,
                           plan::BuildPlanForStage(layout, parsed.input.options, stage));
    report.stages.push_back(std::move(p));
  }
  if (!parsed.requested_stage && !report.budget_bytes) return report;
  parsed.input.options.stage = parsed.requested_stage.value_or(plan::kAutoStage);
  ZEROD_ASSIGN_OR_RETURN(ShardPlan chosen, ShardPlan::Create(parsed.input));
  report.selected_stage = chosen.stage();
  if (parsed.input.options.stage == plan::kAutoStage) {
    const int s = chosen.stage();
    if (!report.budget_bytes) {
      report.selection_reason = "no budget given, so the stage that communicates least";
    } else if (s == 0) {
      report.selection_reason = absl::StrCat("plain data parallel fits the budget of ",
                                             FormatBytes(*report.budget_bytes), " per rank");
    } else {
      report.selection_reason = absl::StrCat(
          "the lowest stage (least communication) within ", FormatBytes(*report.budget_bytes),
          " per rank; stage ", s - 1, " needs ",
          FormatBytes(static_cast<double>(report.stages[s - 1].AllocatedBytesPerRank())));
    }
  }
  return report;
}

}  // namespace

CLI::App* AddPlanCommand(CLI::App& app, PlanFlags& f) {
  CLI::App* cmd = app.add_subcommand(
      "plan", "Memory and communication per rank at ZeRO stages 0-3 (offline, no daemon)");
  cmd->add_option("--params", f.params, "Parameter count: 7.5e9, 7.5B, 128B, 1T, 350M, 1000000");
  cmd->add_option("--layout", f.layout, "Layout file (JSON tensor list) instead of --params");
  cmd->add_option("--dp", f.dp, "Data-parallel ranks (world size)");
  cmd->add_option("--stage", f.stage, "0, 1, 2, 3 or auto (the lowest stage within --budget)");
  cmd->add_option("--dtype", f.dtype, "Parameter and gradient dtype: bf16, fp16 or fp32")
      ->capture_default_str();
  cmd->add_option("--grad-dtype", f.grad_dtype, "Gradient dtype when it differs from --dtype");
  cmd->add_option("--optimizer", f.optimizer, "adam or adamw")->capture_default_str();
  cmd->add_option("--budget", f.budget, "Memory budget per rank: 80GiB, 40GB, ...");
  cmd->add_option("--bucket", f.bucket, "Reduce-bucket size (default 64MiB)");
  cmd->add_option("--unit", f.unit, "Stage-3 gather-unit size (default 64MiB)");
  cmd->add_option("--prefetch", f.prefetch, "Stage-3 units gathered ahead (default 1)");
  cmd->add_option("--max-live-units", f.max_live_units,
                  "Stage-3 bound on gathered units (default prefetch + 1)");
  cmd->add_option("--alignment", f.alignment, "Partition alignment in elements (default 16)");
  cmd->add_flag("--json", f.json, "One JSON object instead of tables");
  return cmd;
}

int RunPlan(const PlanFlags& flags, std::ostream& out, std::ostream& err) {
  auto parsed = Parse(flags);
  if (!parsed.ok()) {
    err << "zeroctl plan: " << parsed.status().message() << "\n";
    return 2;
  }
  auto report = BuildReport(*std::move(parsed));
  if (!report.ok()) {
    err << "zeroctl plan: " << report.status().message() << "\n";
    return 2;
  }
  if (flags.json) {
    out << PlanJson(*report).dump(2) << "\n";
  } else {
    PrintPlanText(*report, out);
  }
  return 0;
}

}  // namespace zerod::zeroctl
