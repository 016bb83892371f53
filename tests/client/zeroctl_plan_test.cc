// `zeroctl plan` as a user runs it: the real binary, its stdout, stderr and exit code.

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/subprocess.h"

namespace zerod {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::ProcessResult;
using testing::RunProcess;

ProcessResult Zeroctl(std::vector<std::string> args) {
  args.insert(args.begin(), ZEROCTL_PATH);
  return RunProcess(args);
}

nlohmann::json Json(std::vector<std::string> args) {
  args.push_back("--json");
  const ProcessResult r = Zeroctl(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

TEST(ZeroctlPlan, TextShowsEveryStageAgainstThePaper) {
  const ProcessResult r = Zeroctl({"plan", "--params", "7.5B", "--dp", "64"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  for (const char* figure : {"120.00 GB", "31.41 GB", "16.64 GB", "1.88 GB", "7.50B parameters",
                             "64 ranks", "all-reduce", "2 all-gathers + reduce-scatter"}) {
    EXPECT_THAT(r.out, HasSubstr(figure));
  }
  for (int stage = 0; stage <= 3; ++stage) {
    EXPECT_THAT(r.out, HasSubstr("stage " + std::to_string(stage) + " ("));
  }
}

TEST(ZeroctlPlan, JsonHasTheFourStages) {
  const nlohmann::json doc = Json({"plan", "--params", "7.5e9", "--dp", "64"});
  ASSERT_EQ(doc["stages"].size(), 4u);
  const int64_t paper[] = {120'000'000'000, 31'406'250'000, 16'640'625'000, 1'875'000'000};
  for (int s = 0; s < 4; ++s) {
    const nlohmann::json& stage = doc["stages"][s];
    EXPECT_EQ(stage["stage"], s);
    EXPECT_EQ(stage["model_state_bytes"].get<int64_t>(), paper[s]);
    EXPECT_GE(stage["total_bytes"].get<int64_t>(), paper[s]);
    EXPECT_GT(stage["comm_bytes_per_step"].get<int64_t>(), 0);
    int64_t sum = 0;
    for (const auto& [name, bytes] : stage["bytes_by_category"].items())
      sum += bytes.get<int64_t>();
    EXPECT_EQ(sum, stage["total_bytes"].get<int64_t>()) << "stage " << s;
  }
  EXPECT_TRUE(doc["selected_stage"].is_null());
}

TEST(ZeroctlPlan, CountSpellingsAgree) {
  const nlohmann::json a = Json({"plan", "--params", "7.5B", "--dp", "16"});
  EXPECT_EQ(Json({"plan", "--params", "7.5e9", "--dp", "16"}), a);
  EXPECT_EQ(Json({"plan", "--params", "7500000000", "--dp", "16"})["stages"], a["stages"]);
  EXPECT_EQ(Json({"plan", "--params", "1T", "--dp", "1024"})["params"], 1'000'000'000'000);
  EXPECT_EQ(Json({"plan", "--params", "128B", "--dp", "4"})["params"], 128'000'000'000);
}

TEST(ZeroctlPlan, BudgetChoosesTheLowestStageThatFits) {
  const ProcessResult r = Zeroctl({"plan", "--params", "7.5B", "--dp", "64", "--budget", "20GiB"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("chosen: stage 2"));
  EXPECT_THAT(r.out, HasSubstr("stage 1 needs"));
  const nlohmann::json doc = Json({"plan", "--params", "7.5B", "--dp", "64", "--budget", "20GiB"});
  EXPECT_EQ(doc["selected_stage"], 2);
  EXPECT_EQ(doc["stages"][1]["fits_budget"], false);
  EXPECT_EQ(doc["stages"][2]["fits_budget"], true);
}

TEST(ZeroctlPlan, ExplicitStageIsShownAlone) {
  const ProcessResult r =
      Zeroctl({"plan", "--params", "1T", "--dp", "1024", "--stage", "3", "--dtype", "fp16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("chosen: stage 3"));
  EXPECT_THAT(r.out, HasSubstr("gather_buffers"));
  EXPECT_THAT(r.out, Not(HasSubstr("stage 1 (optimizer state): bytes")));
}

TEST(ZeroctlPlan, Fp32Training) {
  const nlohmann::json doc = Json({"plan", "--params", "1M", "--dp", "1", "--dtype", "fp32"});
  EXPECT_EQ(doc["optimizer_bytes_per_param"], 8);
  EXPECT_EQ(doc["stages"][0]["model_state_bytes"], 16'000'000);
}

TEST(ZeroctlPlan, LayoutFile) {
  testing::TempDir dir;
  const std::string path = dir.WriteFile("gpt.json", R"({"tensors": [
    {"name": "wte", "shape": [50304, 768], "unit": "embed"},
    {"name": "h0.attn.w", "shape": [768, 2304], "unit": "h0"},
    {"name": "h0.mlp.w", "shape": [768, 3072], "unit": "h0"},
    {"name": "ln_f.w", "shape": [768]}]})");
  const nlohmann::json doc = Json({"plan", "--layout", path, "--dp", "8"});
  EXPECT_EQ(doc["tensors"], 4);
  EXPECT_EQ(doc["params"], 50304 * 768 + 768 * 2304 + 768 * 3072 + 768);
  EXPECT_EQ(doc["stages"][3]["segments"], 3);  // embed, h0, ln_f
}

struct BadInput {
  std::vector<std::string> args;
  const char* names;  // what the one-line error must mention
};

TEST(ZeroctlPlan, BadInputExitsTwoWithOneLine) {
  testing::TempDir dir;
  const std::string malformed = dir.WriteFile("bad.json", R"({"tensors": [{"name": "a"}]})");
  const std::string broken = dir.WriteFile("broken.json", "{\"tensors\": [");
  const BadInput cases[] = {
      {{"plan", "--params", "0", "--dp", "8"}, "--params"},
      {{"plan", "--params", "-5", "--dp", "8"}, "--params"},
      {{"plan", "--params", "lots", "--dp", "8"}, "--params"},
      {{"plan", "--params", "1.5", "--dp", "8"}, "--params"},
      {{"plan", "--params", "7.5B", "--dp", "0"}, "--dp"},
      {{"plan", "--params", "7.5B", "--dp", "x"}, "--dp"},
      {{"plan", "--params", "7.5B"}, "--dp"},
      {{"plan", "--params", "7.5B", "--dp", "8", "--stage", "4"}, "--stage"},
      {{"plan", "--params", "7.5B", "--dp", "8", "--dtype", "fp8"}, "--dtype"},
      {{"plan", "--params", "7.5B", "--dp", "8", "--budget", "lots"}, "--budget"},
      {{"plan", "--params", "7.5B", "--dp", "8", "--budget", "1GB"}, "no ZeRO stage fits"},
      {{"plan", "--params", "7.5B", "--dp", "8", "--stage", "0", "--budget", "80GB"},
       "stage 0 needs"},
      {{"plan", "--layout", dir.path() + "/missing.json", "--dp", "8"}, "missing.json"},
      {{"plan", "--layout", malformed, "--dp", "8"}, "tensors[0].shape"},
      {{"plan", "--layout", broken, "--dp", "8"}, "not valid JSON"},
      {{"plan", "--params", "7.5B", "--layout", malformed, "--dp", "8"}, "exactly one"},
      {{"plan", "--dp", "8"}, "exactly one"},
      {{"plan", "--params", "7.5B", "--dp", "8", "--frobnicate"}, "frobnicate"},
      {{}, "subcommand"},
  };
  for (const BadInput& c : cases) {
    const ProcessResult r = Zeroctl(c.args);
    std::string joined;
    for (const std::string& a : c.args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.names)) << joined;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << joined << ": " << r.err;
    EXPECT_EQ(r.out, "") << joined;
  }
}

TEST(ZeroctlPlan, HelpExitsZero) {
  const ProcessResult r = Zeroctl({"plan", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("--budget"));
}

}  // namespace
}  // namespace zerod
