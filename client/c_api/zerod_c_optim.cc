// The optimizer's part of the C API (zerod_c.h): steps over parameter groups, zero_grad, and this
// rank's optimizer state for opt.state_dict() / load_state_dict().

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/c_api/internal/c_api_support.h"
#include "client/c_api/zerod_c.h"
#include "nlohmann/json.hpp"

namespace {

using nlohmann::json;
using zerod::c_api::internal::Fail;
using zerod::c_api::internal::Invalid;
using zerod::c_api::internal::NeedEngine;
using zerod::c_api::internal::Report;
using zerod::c_api::internal::ReturnJson;
using zerod::c_api::internal::Synced;
using zerod::engine::ModelRun;
using zerod::engine::StateTensor;
using zerod::engine::TrainingCounters;

constexpr int kConfigDoubles = 6;

json CountersJson(const TrainingCounters& c) {
  return {{"applied_steps", c.applied_steps},
          {"steps_taken", c.steps_taken},
          {"loss_scale", c.loss_scaler.scale},
          {"clean_steps", c.loss_scaler.clean_steps},
          {"hysteresis_left", c.loss_scaler.hysteresis_left},
          {"tensor_steps", c.tensor_steps}};
}

absl::StatusOr<TrainingCounters> CountersFromJson(const char* text) {
  if (text == nullptr) return Invalid("restore: no counters (NULL)");
  TrainingCounters c;
  try {
    const json j = json::parse(text);
    c.applied_steps = j.at("applied_steps").get<int64_t>();
    c.steps_taken = j.at("steps_taken").get<int64_t>();
    c.loss_scaler.scale = j.at("loss_scale").get<double>();
    c.loss_scaler.clean_steps = j.at("clean_steps").get<int64_t>();
    c.loss_scaler.hysteresis_left = j.at("hysteresis_left").get<int64_t>();
    c.tensor_steps = j.at("tensor_steps").get<std::vector<int64_t>>();
  } catch (const json::exception& e) {
    return Invalid(
        absl::StrCat("restore: the counters are not as zerod_engine_state_info gives "
                     "them (",
                     e.what(), ")"));
  }
  if (c.applied_steps < 0 || c.steps_taken < c.applied_steps || !(c.loss_scaler.scale > 0) ||
      c.loss_scaler.clean_steps < 0 || c.loss_scaler.hysteresis_left < 0) {
    return Invalid(absl::StrCat("restore: counters out of range: ", text));
  }
  return c;
}

// The held runs end to end must be `count` floats.
absl::StatusOr<std::vector<ModelRun>> HeldRunsOf(zerod_session* s, int which, int64_t count,
                                                 const void* data) {
  if (which < 0 || which >= zerod::engine::kStateTensorCount) {
    return Invalid(absl::StrCat("state tensor ", which, " (expected 0 master, 1 m, 2 v)"));
  }
  std::vector<ModelRun> runs = s->engine->HeldRuns();
  int64_t numel = 0;
  for (const ModelRun& r : runs) numel += r.numel;
  if (count != numel || (data == nullptr && numel > 0)) {
    return Invalid(absl::StrCat("this rank holds ", numel, " elements of the state; given ",
                                data == nullptr ? "NULL" : absl::StrCat(count, " floats")));
  }
  return runs;
}

// Calls fn(which, run, data + offset of the run) for every held run, the runs end to end in
// `data` (`count` floats).
template <typename Pointer, typename Fn>
int EachHeldRun(zerod_session* s, int which, Pointer data, int64_t count, Fn fn) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  auto runs = HeldRunsOf(s, which, count, data);
  if (!runs.ok()) return Fail(runs.status());
  for (const ModelRun& r : *runs) {
    absl::Status done = fn(static_cast<StateTensor>(which), r, data);
    if (!done.ok()) return Fail(done);
    data += r.numel;
  }
  return Report(absl::OkStatus());
}

}  // namespace

extern "C" {

int zerod_engine_step_groups(zerod_session* s, const double* configs, int64_t group_count,
                             const int32_t* tensor_group, int64_t tensor_count, int* applied,
                             double* grad_norm, double* loss_scale) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  if (group_count < 0 || tensor_count < 0 || (configs == nullptr && group_count > 0) ||
      (tensor_group == nullptr && tensor_count > 0)) {
    return Fail(Invalid(absl::StrCat("step: ", group_count, " groups and ", tensor_count,
                                     " tensors, with ", configs ? "" : "no ", "configs and ",
                                     tensor_group ? "" : "no ", "tensor groups")));
  }
  zerod::engine::ParamGroups groups;
  for (int64_t g = 0; g < group_count; ++g) {
    const double* c = configs + g * kConfigDoubles;
    groups.configs.push_back({c[0], c[1], c[2], c[3], c[4], c[5] != 0});
  }
  groups.tensor_group.assign(tensor_group, tensor_group + tensor_count);
  auto result = s->engine->Step(groups);
  if (!result.ok()) return Fail(result.status());
  if (applied != nullptr) *applied = result->applied ? 1 : 0;
  if (grad_norm != nullptr) *grad_norm = result->grad_norm;
  if (loss_scale != nullptr) *loss_scale = result->loss_scale;
  return Report(Synced(s, absl::OkStatus()));
}

int zerod_engine_zero_grad(zerod_session* s, int set_to_none) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  return Report(s->engine->ZeroGrad(set_to_none != 0));
}

int zerod_engine_state_info(zerod_session* s, char** out) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  json runs = json::array();
  int64_t numel = 0;
  for (const ModelRun& r : s->engine->HeldRuns()) {
    runs.push_back({r.offset, r.numel});
    numel += r.numel;
  }
  return ReturnJson(
      {{"runs", runs}, {"numel", numel}, {"counters", CountersJson(s->engine->counters())}}, out);
}

int zerod_engine_read_state(zerod_session* s, int which, float* out, int64_t count) {
  return EachHeldRun(s, which, out, count, [&](StateTensor t, const ModelRun& r, float* at) {
    return s->engine->ReadState(t, r, at);
  });
}

int zerod_engine_write_state(zerod_session* s, int which, const float* values, int64_t count) {
  return EachHeldRun(s, which, values, count,
                     [&](StateTensor t, const ModelRun& r, const float* at) {
                       return s->engine->WriteState(t, r, at);
                     });
}

int zerod_engine_finish_restore(zerod_session* s, const char* counters_json) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  auto counters = CountersFromJson(counters_json);
  if (!counters.ok()) return Fail(counters.status());
  return Report(Synced(s, s->engine->FinishRestore(*counters)));
}

}  // extern "C"
