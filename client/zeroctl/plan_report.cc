#include "client/zeroctl/plan_report.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/common/units.h"

namespace zerod::zeroctl {
namespace {

using plan::MemoryCategory;
using plan::ShardPlan;

constexpr const char* kPartitioned[] = {"nothing", "optimizer state", "+ gradients",
                                        "+ parameters"};
constexpr const char* kCollectives[] = {"all-reduce", "reduce-scatter + all-gather",
                                        "reduce-scatter + all-gather",
                                        "2 all-gathers + reduce-scatter"};

std::string OptimizerName(plan::Optimizer o) {
  return o == plan::Optimizer::kAdam ? "adam" : "adamw";
}

std::string Percent(double part, double whole) {
  if (whole <= 0) return "-";
  return absl::StrFormat("%.1f%%", 100.0 * (1.0 - part / whole));
}

void PrintStageTable(const ShardPlan& p, std::ostream& out) {
  const plan::MemoryBreakdown real = p.MemoryForRank(0);
  const plan::MemoryBreakdownPaper paper = p.PaperBytes();
  out << absl::StrFormat("\nstage %d (%s): bytes per rank by category, rank 0\n", p.stage(),
                         p.stage() == 0 ? "plain data parallel" : kPartitioned[p.stage()]);
  out << absl::StrFormat("  %-16s %14s %14s\n", "category", "paper formula", "allocated");
  for (int c = 0; c < plan::kMemoryCategoryCount; ++c) {
    const auto cat = static_cast<MemoryCategory>(c);
    const bool model_state = c < static_cast<int>(MemoryCategory::kPadding);
    if (real[cat] == 0 && paper[c] == 0) continue;
    out << absl::StrFormat("  %-16s %14s %14s\n", plan::MemoryCategoryName(cat),
                           model_state ? FormatBytes(paper[c]) : "-", FormatBytes(real[cat]));
  }
  out << absl::StrFormat("  %-16s %14s %14s\n", "total", FormatBytes(p.PaperModelStateBytes()),
                         FormatBytes(static_cast<double>(p.AllocatedBytesPerRank())));
  const plan::CommVolume c = p.CommPerStep();
  out << "  comm per step:";
  if (c.Total() == 0) out << " none (one rank)";
  if (c.all_reduce_bytes) out << " all-reduce " << FormatBytes(c.all_reduce_bytes);
  if (c.reduce_scatter_bytes) out << " reduce-scatter " << FormatBytes(c.reduce_scatter_bytes);
  if (c.all_gather_bytes) {
    out << (c.reduce_scatter_bytes ? "," : "") << " all-gather " << FormatBytes(c.all_gather_bytes);
  }
  out << absl::StrFormat(
      "; %d segments of up to %s, plan digest %s\n", static_cast<int64_t>(p.segments().size()),
      FormatBytes(static_cast<double>(p.max_segment_numel() * DTypeBytes(p.options().param_dtype))),
      p.DigestHex());
}

}  // namespace

void PrintPlanText(const PlanReport& r, std::ostream& out) {
  const ShardPlan& base = r.stages.front();
  const plan::PlanOptions& o = base.options();
  out << absl::StrFormat(
      "zerod plan: %s parameters (%s), %d ranks, %s params, %s grads, %s (K=%d)\n",
      FormatCount(base.total_numel()), r.source, o.world_size, DTypeName(o.param_dtype),
      DTypeName(o.grad_dtype), OptimizerName(o.optimizer), base.OptimizerBytesPerParam());
  out << "Bytes per rank in decimal units. \"paper\" is the ZeRO paper's model-state formula; "
         "\"allocated\" adds padding and bucket/gather buffers.\n\n";
  const double stage0 = static_cast<double>(base.AllocatedBytesPerRank());
  out << absl::StrFormat("  %-5s %-16s %12s %12s %10s %12s  %s\n", "stage", "partitions", "paper",
                         "allocated", "saving", "comm/step", "collectives");
  for (const ShardPlan& p : r.stages) {
    const double allocated = static_cast<double>(p.AllocatedBytesPerRank());
    const bool over = r.budget_bytes && allocated > static_cast<double>(*r.budget_bytes);
    const char* mark = over ? "x" : (r.selected_stage == p.stage() ? "*" : " ");
    out << absl::StrFormat(
        "%s %-5d %-16s %12s %12s %10s %12s  %s\n", mark, p.stage(), kPartitioned[p.stage()],
        FormatBytes(p.PaperModelStateBytes()), FormatBytes(allocated),
        p.stage() == 0 ? "-" : Percent(allocated, stage0),
        FormatBytes(static_cast<double>(p.CommPerStep().Total())), kCollectives[p.stage()]);
  }
  if (r.budget_bytes) {
    out << absl::StrFormat("\nbudget %s (%.2f GiB) per rank; x = over budget.\n",
                           FormatBytes(static_cast<double>(*r.budget_bytes)),
                           static_cast<double>(*r.budget_bytes) / (1 << 30));
  }
  if (r.selected_stage) {
    out << absl::StrFormat("%schosen: stage %d (*)%s%s\n", r.budget_bytes ? "" : "\n",
                           *r.selected_stage, r.selection_reason.empty() ? "" : ": ",
                           r.selection_reason);
    PrintStageTable(r.stages[*r.selected_stage], out);
    return;
  }
  for (const ShardPlan& p : r.stages) PrintStageTable(p, out);
}

nlohmann::json PlanJson(const PlanReport& r) {
  const ShardPlan& base = r.stages.front();
  const plan::PlanOptions& o = base.options();
  nlohmann::json doc;
  doc["params"] = base.total_numel();
  doc["tensors"] = base.tensors().size();
  doc["source"] = r.source;
  doc["world_size"] = o.world_size;
  doc["param_dtype"] = std::string(DTypeName(o.param_dtype));
  doc["grad_dtype"] = std::string(DTypeName(o.grad_dtype));
  doc["optimizer"] = OptimizerName(o.optimizer);
  doc["optimizer_bytes_per_param"] = base.OptimizerBytesPerParam();
  if (r.budget_bytes) doc["budget_bytes"] = *r.budget_bytes;
  doc["selected_stage"] = r.selected_stage ? nlohmann::json(*r.selected_stage) : nlohmann::json();
  if (!r.selection_reason.empty()) doc["selection_reason"] = r.selection_reason;
  const double stage0 = static_cast<double>(base.AllocatedBytesPerRank());
  nlohmann::json stages = nlohmann::json::array();
  for (const ShardPlan& p : r.stages) {
    const plan::MemoryBreakdown real = p.MemoryForRank(0);
    const plan::MemoryBreakdownPaper paper = p.PaperBytes();
    const plan::CommVolume c = p.CommPerStep();
    nlohmann::json s;
    s["stage"] = p.stage();
    s["model_state_bytes"] = std::llround(p.PaperModelStateBytes());
    s["total_bytes"] = p.AllocatedBytesPerRank();
    s["saving_vs_stage0"] = 1.0 - static_cast<double>(p.AllocatedBytesPerRank()) / stage0;
    s["comm_bytes_per_step"] = c.Total();
    s["comm_by_collective"] = {{"all_reduce", c.all_reduce_bytes},
                               {"reduce_scatter", c.reduce_scatter_bytes},
                               {"all_gather", c.all_gather_bytes}};
    nlohmann::json by_category = nlohmann::json::object();
    nlohmann::json paper_by_category = nlohmann::json::object();
    for (int k = 0; k < plan::kMemoryCategoryCount; ++k) {
      const auto cat = static_cast<MemoryCategory>(k);
      by_category[std::string(plan::MemoryCategoryName(cat))] = real[cat];
      if (k < static_cast<int>(MemoryCategory::kPadding)) {
        paper_by_category[std::string(plan::MemoryCategoryName(cat))] = std::llround(paper[k]);
      }
    }
    s["bytes_by_category"] = by_category;
    s["paper_bytes_by_category"] = paper_by_category;
    s["padded_numel"] = p.padded_numel();
    s["shard_numel"] = p.shard_numel();
    s["segments"] = p.segments().size();
    s["plan_digest"] = p.DigestHex();
    if (r.budget_bytes) s["fits_budget"] = p.AllocatedBytesPerRank() <= *r.budget_bytes;
    stages.push_back(std::move(s));
  }
  doc["stages"] = std::move(stages);
  return doc;
}

}  // namespace zerod::zeroctl
