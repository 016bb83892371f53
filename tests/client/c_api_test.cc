// The C API (client/c_api/zerod_c.h) as a C caller sees it: status codes and messages for bad
// options, then one rank of a real job through every call, against the real zerod binary. (The
// Python front end drives the same library in tests/python; this test also runs in the
// sanitizer builds, which leave Python out.)

#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/c_api/zerod_c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/process.h"
#include "tests/util/test_time.h"

namespace zerod::testing {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

constexpr int kInvalidArgument = 3;
constexpr int kFailedPrecondition = 9;

// The real zerod in a temporary folder. (Not tests/integration's harness: that links the gRPC
// client, whose protobuf descriptors would then be registered twice in this process, once more
// inside libzerod_c.so.)
class Daemon {
 public:
  Daemon() {
    char dir[] = "/tmp/zerod-c-api-XXXXXX";
    dir_ = mkdtemp(dir);
    process_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{ZEROD_PATH, "--socket", dir_ + "/zerod.sock", "--listen", "",
                                 "--data-dir", dir_ + "/data", "--lease-ttl",
                                 ScaledFlag(absl::Seconds(10))},
        dir_ + "/zerod.log");
    struct stat st {};
    const absl::Time deadline = absl::Now() + Scaled(absl::Seconds(10));
    while (stat((dir_ + "/zerod.sock").c_str(), &st) != 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
  }
  ~Daemon() {
    process_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string endpoint() const { return "unix://" + dir_ + "/zerod.sock"; }

 private:
  std::string dir_;
  std::unique_ptr<ChildProcess> process_;
};

std::string SessionJson(const std::string& endpoint, const std::string& job, int stage) {
  return json{{"endpoint", endpoint},
              {"job", job},
              {"rank", 0},
              {"world_size", 1},
              {"heartbeat_ms", 50},
              {"layout", json::array({{{"name", "w"}, {"shape", {3, 5}}, {"unit", "a"}},
                                      {{"name", "b"}, {"shape", {5}}, {"unit", "b"}}})},
              {"plan", {{"stage", stage}, {"param_dtype", "fp32"}, {"grad_dtype", "fp32"}}}}
      .dump();
}

TEST(CApi, BadSessionOptionsAreNamed) {
  zerod_session* s = reinterpret_cast<zerod_session*>(1);
  EXPECT_EQ(zerod_session_start("not json", &s), kInvalidArgument);
  EXPECT_EQ(s, nullptr);
  EXPECT_THAT(zerod_last_error(), HasSubstr("session: options are not JSON"));
  // A number no double holds is an error, not an exception through the C boundary (found by
  // c_api_options_fuzz: it aborted the Python process).
  EXPECT_EQ(zerod_session_start(R"({"rank": 1e999})", &s), kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("session: options are not JSON"));
  EXPECT_EQ(zerod_session_start("[1]", &s), kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("session: options are not a JSON object"));
  EXPECT_EQ(zerod_session_start("{}", &s), kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("layout: the model's tensors are missing"));
  EXPECT_EQ(zerod_session_start(R"({"layout": [], "rank": "zero"})", &s), kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("rank: expected an integer, got \"zero\""));
  EXPECT_EQ(zerod_session_start(R"({"layout": [], "rank": 0.9})", &s), kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("rank: expected an integer, got 0.9"));
  EXPECT_EQ(zerod_session_start(R"({"layout": [], "plan": {"stage": 4294967299}})", &s),
            kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("stage: expected an integer in range"));
  EXPECT_EQ(zerod_session_start(R"({"layout": [], "colective_timeout_s": 5})", &s),
            kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("session: unknown option 'colective_timeout_s'"));
  EXPECT_EQ(zerod_session_start(R"({"layout": [], "plan": {"param_dtype": "fp8"}})", &s),
            kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("param_dtype: unknown dtype 'fp8'"));
  EXPECT_EQ(zerod_session_start(R"({"layout": [], "plan": {"optimizer": "sgd"}})", &s),
            kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("optimizer: 'sgd' is not adam or adamw"));
  EXPECT_EQ(zerod_session_start(R"({"layout": [{"name": "w", "shape": [-2]}]})", &s),
            kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("layout: "));
  EXPECT_EQ(zerod_session_start(nullptr, &s), kInvalidArgument);
  EXPECT_EQ(zerod_engine_create(nullptr, "{}"), kInvalidArgument);
  EXPECT_EQ(zerod_engine_step(nullptr, -1, nullptr, nullptr, nullptr), kInvalidArgument);
  zerod_session_destroy(nullptr);  // ignored
}

TEST(CApi, OneRankThroughEveryCall) {
  Daemon zerod;
  zerod_session* s = nullptr;
  ASSERT_EQ(zerod_session_start(SessionJson(zerod.endpoint(), "c-api", 3).c_str(), &s), 0)
      << zerod_last_error();
  char* text = nullptr;
  ASSERT_EQ(zerod_session_describe(s, &text), 0);
  const json described = json::parse(text);
  zerod_free(text);
  EXPECT_EQ(described["stage"], 3);
  EXPECT_EQ(described["world_size"], 1);
  EXPECT_EQ(described["tensor_units"], json::array({0, 1}));
  EXPECT_EQ(described["total_numel"], 20);

  EXPECT_EQ(zerod_engine_gather(s, 0), kFailedPrecondition);
  EXPECT_THAT(zerod_last_error(), HasSubstr("the session has no engine yet"));
  EXPECT_EQ(zerod_engine_create(s, R"({"lr": -1})"), kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("lr: -1 is out of range (expected lr >= 0)"));
  EXPECT_EQ(zerod_engine_create(s, R"({"beta2": 1.0})"), kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("beta2: 1 is out of range (expected 0 <= beta2 < 1)"));
  EXPECT_EQ(zerod_engine_create(s, R"({"accumulation_steps": 0})"), kInvalidArgument);
  ASSERT_EQ(zerod_engine_create(s, R"({"lr": 0.1, "adamw": true, "weight_decay": 0.5})"), 0)
      << zerod_last_error();
  EXPECT_EQ(zerod_engine_create(s, "{}"), kFailedPrecondition);  // one engine per session

  std::vector<float> w(15), b(5);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i) * 0.1f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
  const float* tensors[] = {w.data(), b.data()};
  ASSERT_EQ(zerod_engine_init_from(s, 0, tensors), 0) << zerod_last_error();
  ASSERT_EQ(zerod_engine_gather(s, 0), 0) << zerod_last_error();
  void* data = nullptr;
  ASSERT_EQ(zerod_engine_param(s, 0, &data), 0);
  EXPECT_EQ(static_cast<float*>(data)[7], 0.7f);
  EXPECT_EQ(zerod_engine_param(s, 1, &data), 0);  // unit 1 was prefetched: there too
  ASSERT_EQ(zerod_engine_release(s, 0), 0);
  EXPECT_EQ(zerod_engine_release(s, 0), kFailedPrecondition);

  std::vector<float> gw(15, 1.0f), gb(5, -1.0f);
  ASSERT_EQ(zerod_engine_accumulate_grad(s, 1, gb.data()), 0) << zerod_last_error();
  ASSERT_EQ(zerod_engine_accumulate_grad(s, 0, gw.data()), 0) << zerod_last_error();
  int applied = 0;
  double norm = -1, scale = 0;
  ASSERT_EQ(zerod_engine_step(s, -1, &applied, &norm, &scale), 0) << zerod_last_error();
  EXPECT_EQ(applied, 1);
  EXPECT_EQ(scale, 1.0);
  double mean = 0;
  ASSERT_EQ(zerod_engine_average(s, 2.5, &mean), 0);
  EXPECT_EQ(mean, 2.5);

  // AdamW's first step: w (1 - lr wd) - lr sign(g), as torch computes it.
  std::vector<float> full(20);
  EXPECT_EQ(zerod_engine_full_parameters(s, full.data(), 19), kInvalidArgument);
  ASSERT_EQ(zerod_engine_full_parameters(s, full.data(), 20), 0);
  EXPECT_NEAR(full[7], 0.7f * 0.95f - 0.1f, 1e-6);
  EXPECT_NEAR(full[15 + 2], -2.0f * 0.95f + 0.1f, 1e-6);

  float state[2] = {4.0f, 5.0f};
  EXPECT_EQ(zerod_engine_broadcast(s, state, 2, 0), 0);
  EXPECT_EQ(zerod_engine_broadcast(s, state, 2, 1), kInvalidArgument);
  ASSERT_EQ(zerod_engine_stats(s, &text), 0);
  const json stats = json::parse(text);
  zerod_free(text);
  EXPECT_EQ(stats["step"], 1);
  EXPECT_EQ(stats["allocated_bytes"], described["planned_bytes"]);
  EXPECT_EQ(zerod_engine_synchronize(s), 0);
  EXPECT_EQ(zerod_session_leave(s), 0);
  zerod_session_destroy(s);
}

// The optimizer's calls (zerod_c_optim.cc): a step over two parameter groups, a tensor without a
// gradient (not stepped), zero_grad, and this rank's state out and back in.
// A launcher that hands out the job's token and each rank's Gloo address itself (zerod.torch under
// torchrun) passes them as options: the token given owns the job, and describe reports the
// address the peers are told.
TEST(CApi, JobTokenAndPeerAddressComeFromTheOptions) {
  Daemon zerod;
  json options = json::parse(SessionJson(zerod.endpoint(), "c-api-token", 0));
  options["job_token"] = std::string(64, 'a');
  options["peer_address"] = "localhost";
  zerod_session* s = nullptr;
  ASSERT_EQ(zerod_session_start(options.dump().c_str(), &s), 0) << zerod_last_error();
  char* text = nullptr;
  ASSERT_EQ(zerod_session_describe(s, &text), 0);
  EXPECT_EQ(json::parse(text)["peer_address"], "localhost");
  zerod_free(text);
  zerod_session_destroy(s);

  options["job_token"] = std::string(64, 'b');
  s = nullptr;
  EXPECT_EQ(zerod_session_start(options.dump().c_str(), &s), 7);  // PERMISSION_DENIED
  EXPECT_EQ(s, nullptr);
  EXPECT_THAT(zerod_last_error(), HasSubstr("c-api-token"));
}

TEST(CApi, ParameterGroupsZeroGradAndTheOptimizerState) {
  Daemon zerod;
  zerod_session* s = nullptr;
  ASSERT_EQ(zerod_session_start(SessionJson(zerod.endpoint(), "c-api-optim", 2).c_str(), &s), 0)
      << zerod_last_error();
  EXPECT_EQ(zerod_engine_zero_grad(s, 1), kFailedPrecondition);  // no engine yet
  ASSERT_EQ(zerod_engine_create(s, R"({"average_accumulation": false})"), 0) << zerod_last_error();
  std::vector<float> w(15, 1.0f), b(5, -1.0f);
  const float* tensors[] = {w.data(), b.data()};
  ASSERT_EQ(zerod_engine_init_from(s, 0, tensors), 0) << zerod_last_error();

  // w in group 0 (AdamW, lr 0.1, weight decay 0.5), b in group 1 (lr 0.2): b has no gradient.
  const double configs[] = {0.1, 0.9, 0.999, 1e-8, 0.5, 1, 0.2, 0.9, 0.999, 1e-8, 0.0, 1};
  const int32_t groups[] = {0, 1};
  std::vector<float> gw(15, 1.0f);
  ASSERT_EQ(zerod_engine_accumulate_grad(s, 1, nullptr), 0) << zerod_last_error();
  ASSERT_EQ(zerod_engine_accumulate_grad(s, 0, gw.data()), 0) << zerod_last_error();
  int applied = 0;
  EXPECT_EQ(zerod_engine_step_groups(s, configs, 2, groups, 1, &applied, nullptr, nullptr),
            kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("groups given for 1 tensors; the model has 2"));
  EXPECT_EQ(zerod_engine_step_groups(s, nullptr, 2, groups, 2, &applied, nullptr, nullptr),
            kInvalidArgument);
  ASSERT_EQ(zerod_engine_step_groups(s, configs, 2, groups, 2, &applied, nullptr, nullptr), 0)
      << zerod_last_error();
  std::vector<float> full(20);
  ASSERT_EQ(zerod_engine_full_parameters(s, full.data(), 20), 0);
  EXPECT_NEAR(full[3], 1.0f * 0.95f - 0.1f, 1e-6);  // AdamW's first step
  EXPECT_EQ(full[15], -1.0f) << "b had no gradient: not stepped";

  char* text = nullptr;
  ASSERT_EQ(zerod_engine_state_info(s, &text), 0);
  const json info = json::parse(text);
  zerod_free(text);
  EXPECT_EQ(info["runs"], json::array({json::array({0, 20})}));
  EXPECT_EQ(info["counters"]["tensor_steps"], json::array({1, 0}));
  std::vector<float> m(20), v(20), master(20);
  EXPECT_EQ(zerod_engine_read_state(s, 1, m.data(), 19), kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("this rank holds 20 elements of the state; given 19"));
  EXPECT_EQ(zerod_engine_read_state(s, 3, m.data(), 20), kInvalidArgument);
  ASSERT_EQ(zerod_engine_read_state(s, 1, m.data(), 20), 0);
  ASSERT_EQ(zerod_engine_read_state(s, 2, v.data(), 20), 0);
  EXPECT_NEAR(m[0], 0.1f, 1e-7);  // (1 - beta1) g
  EXPECT_EQ(m[15], 0.0f);

  // A second step, then the state written back: the engine is as after the first.
  ASSERT_EQ(zerod_engine_accumulate_grad(s, 1, nullptr), 0);
  ASSERT_EQ(zerod_engine_accumulate_grad(s, 0, gw.data()), 0);
  ASSERT_EQ(zerod_engine_zero_grad(s, 0), 0);  // discards: the step sees zeros
  ASSERT_EQ(zerod_engine_step_groups(s, configs, 2, groups, 2, &applied, nullptr, nullptr), 0);
  ASSERT_EQ(zerod_engine_write_state(s, 1, m.data(), 20), 0);
  ASSERT_EQ(zerod_engine_write_state(s, 2, v.data(), 20), 0);
  EXPECT_EQ(zerod_engine_finish_restore(s, R"({"applied_steps": 1})"), kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("counters are not as zerod_engine_state_info"));
  ASSERT_EQ(zerod_engine_finish_restore(s, info["counters"].dump().c_str()), 0)
      << zerod_last_error();
  ASSERT_EQ(zerod_engine_state_info(s, &text), 0);
  EXPECT_EQ(json::parse(text)["counters"], info["counters"]);
  zerod_free(text);
  std::vector<float> m_again(20);
  ASSERT_EQ(zerod_engine_read_state(s, 1, m_again.data(), 20), 0);
  EXPECT_EQ(m_again, m);
  EXPECT_EQ(zerod_session_leave(s), 0);
  zerod_session_destroy(s);
}

TEST(CApi, SaveAndLoadACheckpointWithItsUserTextAndExtraBytes) {
  Daemon zerod;
  char tmp[] = "/tmp/zerod-c-api-ckpt-XXXXXX";
  const std::string root = std::string(mkdtemp(tmp)) + "/ckpt";
  zerod_session* s = nullptr;
  ASSERT_EQ(zerod_session_start(SessionJson(zerod.endpoint(), "c-api-ckpt", 2).c_str(), &s), 0)
      << zerod_last_error();
  int64_t step = 7;
  EXPECT_EQ(zerod_engine_save(s, root.c_str(), 0, 1, nullptr, nullptr, 0, &step, nullptr),
            kFailedPrecondition);
  EXPECT_THAT(zerod_last_error(), HasSubstr("the session has no engine yet"));
  ASSERT_EQ(zerod_engine_create(s, R"({"lr": 0.1})"), 0) << zerod_last_error();

  // Nothing there yet: step -1 and no outputs, not an error.
  char *user = nullptr, *extra = nullptr, *dir = nullptr;
  int64_t extra_len = -1;
  ASSERT_EQ(zerod_engine_load(s, root.c_str(), &step, &user, &extra, &extra_len, &dir), 0)
      << zerod_last_error();
  EXPECT_EQ(step, -1);
  EXPECT_EQ(user, nullptr);
  EXPECT_EQ(extra_len, 0);

  EXPECT_EQ(zerod_engine_save(s, nullptr, 0, 1, nullptr, nullptr, 0, &step, nullptr),
            kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("save: no root directory"));
  EXPECT_EQ(zerod_engine_save(s, root.c_str(), 0, 1, nullptr, nullptr, 5, &step, nullptr),
            kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("extra is NULL with extra_len 5"));
  EXPECT_EQ(zerod_engine_save(s, root.c_str(), -2, 1, nullptr, nullptr, 0, &step, nullptr),
            kInvalidArgument);
  EXPECT_THAT(zerod_last_error(), HasSubstr("keep_last is -2"));

  const std::string bytes("buf\0fers", 8);  // binary: the length counts, not a NUL
  ASSERT_EQ(zerod_engine_save(s, root.c_str(), 1, 1, R"({"epoch": 2})", bytes.data(),
                              static_cast<int64_t>(bytes.size()), &step, &dir),
            0)
      << zerod_last_error();
  EXPECT_EQ(step, 0);
  const std::string saved_dir = dir;
  zerod_free(dir);
  EXPECT_EQ(saved_dir, root + "/step-000000000000");
  // Resume: the newest of a snapshot directory and several roots (none of them holding another
  // checkpoint), and none anywhere.
  ASSERT_EQ(zerod_engine_resume(s, (root + "-snapshots").c_str(), (root + "-none\n" + root).c_str(),
                                &step, nullptr, nullptr, nullptr, &dir),
            0)
      << zerod_last_error();
  EXPECT_EQ(step, 0);
  EXPECT_EQ(std::string(dir), saved_dir);
  zerod_free(dir);
  ASSERT_EQ(zerod_engine_resume(s, nullptr, (root + "-none").c_str(), &step, nullptr, nullptr,
                                nullptr, &dir),
            0);
  EXPECT_EQ(step, -1);
  EXPECT_EQ(dir, nullptr);
  EXPECT_EQ(zerod_engine_resume(s, "", "", &step, nullptr, nullptr, nullptr, nullptr),
            kInvalidArgument);

  ASSERT_EQ(zerod_engine_load(s, root.c_str(), &step, &user, &extra, &extra_len, &dir), 0)
      << zerod_last_error();
  EXPECT_EQ(step, 0);
  EXPECT_STREQ(user, R"({"epoch": 2})");
  EXPECT_EQ(std::string(extra, static_cast<size_t>(extra_len)), bytes);
  EXPECT_EQ(std::string(dir), saved_dir);
  zerod_free(user);
  zerod_free(extra);
  zerod_free(dir);
  // A step directory that does not exist, named as such, is an error.
  EXPECT_EQ(zerod_engine_load(s, (root + "/step-000000000009").c_str(), &step, nullptr, nullptr,
                              nullptr, nullptr),
            5);
  EXPECT_THAT(zerod_last_error(), HasSubstr("does not exist"));
  EXPECT_EQ(zerod_session_leave(s), 0);
  zerod_session_destroy(s);
  std::error_code ignored;
  std::filesystem::remove_all(tmp, ignored);
}

}  // namespace
}  // namespace zerod::testing
