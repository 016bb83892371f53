// The C API over TrainerSession and ZeroEngine (zerod_c.h). Each function converts its arguments,
// calls the C++ API and turns an absl::Status into a code plus a thread-local message; no
// exception crosses the C boundary. JSON options are checked field by field, so a bad value is
// INVALID_ARGUMENT naming the field, not a crash in the caller's Python.

#include "client/c_api/zerod_c.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/c_api/internal/c_api_support.h"
#include "client/layout_json.h"
#include "client/trainer_session.h"
#include "nlohmann/json.hpp"
#include "runtime/common/status_macros.h"

namespace {

using nlohmann::json;
using zerod::DType;
using zerod::c_api::internal::Fail;
using zerod::c_api::internal::Invalid;
using zerod::c_api::internal::NeedEngine;
using zerod::c_api::internal::Report;
using zerod::c_api::internal::ReturnJson;
using zerod::c_api::internal::Synced;

// Reads an optional field of `object` into `out`, checking its JSON type exactly: an integer
// field takes only an integer that fits (0.9 is not rank 0), a boolean only true or false.
template <typename T>
absl::Status Field(const json& object, const char* name, T& out) {
  auto it = object.find(name);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  auto unexpected = [&](const char* expected) {
    return Invalid(absl::StrCat(name, ": expected ", expected, ", got ", it->dump()));
  };
  if constexpr (std::is_same_v<T, bool>) {
    if (!it->is_boolean()) return unexpected("true or false");
    out = it->get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return unexpected("an integer");
    if (it->is_number_unsigned() ? it->get<uint64_t>() > uint64_t{std::numeric_limits<T>::max()}
                                 : it->get<int64_t>() < std::numeric_limits<T>::min() ||
                                       it->get<int64_t>() > std::numeric_limits<T>::max()) {
      return unexpected("an integer in range");
    }
    out = static_cast<T>(it->get<int64_t>());
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!it->is_number()) return unexpected("a number");
    out = it->get<T>();
  } else {
    if (!it->is_string()) return unexpected("a string");
    out = it->get<std::string>();
  }
  return absl::OkStatus();
}

// Every key of `object` must be one of `known`: a misspelt option is an error, not a default.
absl::Status KnownKeys(const json& object, const char* what,
                       std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      return Invalid(absl::StrCat(what, ": unknown option '", key, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status DTypeField(const json& object, const char* name, DType& out) {
  std::string text;
  ZEROD_RETURN_IF_ERROR(Field(object, name, text));
  if (text.empty()) return absl::OkStatus();
  auto dtype = zerod::ParseDType(text);
  if (!dtype.ok()) return Invalid(absl::StrCat(name, ": ", dtype.status().message()));
  out = *dtype;
  return absl::OkStatus();
}

absl::StatusOr<json> ParseObject(const char* text, const char* what) {
  if (text == nullptr) return Invalid(absl::StrCat(what, ": no options given"));
  json parsed;
  try {
    parsed = json::parse(text);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number no double holds ("1e999"): an exception must
    // not cross the C boundary into the caller (Python would abort).
    return Invalid(absl::StrCat(what, ": options are not JSON (", e.what(), ")"));
  }
  if (!parsed.is_object()) return Invalid(absl::StrCat(what, ": options are not a JSON object"));
  return parsed;
}

absl::Status ParsePlanOptions(const json& plan, zerod::plan::PlanOptions& out) {
  ZEROD_RETURN_IF_ERROR(KnownKeys(
      plan, "plan",
      {"stage", "param_dtype", "grad_dtype", "optimizer", "reduce_bucket_bytes", "bucket_buffers",
       "gather_unit_bytes", "prefetch_depth", "max_live_units", "partition_alignment_numel"}));
  ZEROD_RETURN_IF_ERROR(Field(plan, "stage", out.stage));
  ZEROD_RETURN_IF_ERROR(DTypeField(plan, "param_dtype", out.param_dtype));
  ZEROD_RETURN_IF_ERROR(DTypeField(plan, "grad_dtype", out.grad_dtype));
  std::string optimizer;
  ZEROD_RETURN_IF_ERROR(Field(plan, "optimizer", optimizer));
  if (optimizer == "adamw") {
    out.optimizer = zerod::plan::Optimizer::kAdamW;
  } else if (optimizer == "adam") {
    out.optimizer = zerod::plan::Optimizer::kAdam;
  } else if (!optimizer.empty()) {
    return Invalid(absl::StrCat("optimizer: '", optimizer, "' is not adam or adamw"));
  }
  ZEROD_RETURN_IF_ERROR(Field(plan, "reduce_bucket_bytes", out.reduce_bucket_bytes));
  ZEROD_RETURN_IF_ERROR(Field(plan, "bucket_buffers", out.bucket_buffers));
  ZEROD_RETURN_IF_ERROR(Field(plan, "gather_unit_bytes", out.gather_unit_bytes));
  ZEROD_RETURN_IF_ERROR(Field(plan, "prefetch_depth", out.prefetch_depth));
  ZEROD_RETURN_IF_ERROR(Field(plan, "max_live_units", out.max_live_units));
  ZEROD_RETURN_IF_ERROR(Field(plan, "partition_alignment_numel", out.partition_alignment_numel));
  return absl::OkStatus();
}

absl::StatusOr<zerod::client::SessionOptions> ParseSessionOptions(const char* text) {
  ZEROD_ASSIGN_OR_RETURN(json o, ParseObject(text, "session"));
  ZEROD_RETURN_IF_ERROR(
      KnownKeys(o, "session",
                {"endpoint", "job", "job_token", "peer_address", "rank", "world_size", "device",
                 "budget_bytes", "gather_communicator", "join_timeout_s", "collective_timeout_s",
                 "heartbeat_ms", "plan", "layout", "agreed"}));
  zerod::client::SessionOptions options;
  ZEROD_RETURN_IF_ERROR(Field(o, "endpoint", options.endpoint));
  ZEROD_RETURN_IF_ERROR(Field(o, "job", options.job_id));
  ZEROD_RETURN_IF_ERROR(Field(o, "job_token", options.job_token));
  ZEROD_RETURN_IF_ERROR(Field(o, "peer_address", options.peer_address));
  ZEROD_RETURN_IF_ERROR(Field(o, "rank", options.rank));
  ZEROD_RETURN_IF_ERROR(Field(o, "world_size", options.world_size));
  ZEROD_RETURN_IF_ERROR(Field(o, "device", options.device));
  ZEROD_RETURN_IF_ERROR(Field(o, "budget_bytes", options.budget_bytes));
  ZEROD_RETURN_IF_ERROR(Field(o, "gather_communicator", options.gather_communicator));
  double seconds = 0;
  int64_t millis = 0;
  ZEROD_RETURN_IF_ERROR(Field(o, "join_timeout_s", seconds));
  if (seconds > 0) options.join_timeout = absl::Seconds(seconds);
  seconds = 0;
  ZEROD_RETURN_IF_ERROR(Field(o, "collective_timeout_s", seconds));
  if (seconds > 0) options.collective_timeout = absl::Seconds(seconds);
  ZEROD_RETURN_IF_ERROR(Field(o, "heartbeat_ms", millis));
  if (millis > 0) options.heartbeat_interval = absl::Milliseconds(millis);
  if (auto plan = o.find("plan"); plan != o.end()) {
    if (!plan->is_object()) return Invalid("plan: expected an object");
    ZEROD_RETURN_IF_ERROR(ParsePlanOptions(*plan, options.plan_options));
  }
  if (auto agreed = o.find("agreed"); agreed != o.end()) {
    if (!agreed->is_object()) return Invalid("agreed: expected an object of strings");
    for (const auto& [name, value] : agreed->items()) {
      if (!value.is_string()) {
        return Invalid(absl::StrCat("agreed: '", name, "' is not a string: ", value.dump()));
      }
      options.agreed_options[name] = value.get<std::string>();
    }
  }
  auto layout = o.find("layout");
  if (layout == o.end()) return Invalid("layout: the model's tensors are missing");
  auto tensors = zerod::client::ParseLayoutJson(layout->dump(), options.plan_options.param_dtype);
  if (!tensors.ok()) return Invalid(absl::StrCat("layout: ", tensors.status().message()));
  options.layout = *std::move(tensors);
  return options;
}

// Checks a value the way torch.optim does, naming the field and the range expected.
absl::Status InRange(const char* name, double value, double low, double high, bool high_open,
                     const char* expected) {
  if (!std::isfinite(value) || value < low || (high_open ? value >= high : value > high)) {
    return Invalid(absl::StrCat(name, ": ", value, " is out of range (expected ", expected, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<zerod::engine::EngineOptions> ParseEngineOptions(const char* text) {
  ZEROD_ASSIGN_OR_RETURN(json o, ParseObject(text, "engine"));
  ZEROD_RETURN_IF_ERROR(
      KnownKeys(o, "engine",
                {"lr", "beta1", "beta2", "eps", "weight_decay", "adamw", "max_grad_norm",
                 "accumulation_steps", "average_accumulation", "threads", "loss_scale"}));
  zerod::engine::EngineOptions options;
  zerod::optim::AdamConfig& adam = options.adam;
  ZEROD_RETURN_IF_ERROR(Field(o, "lr", adam.lr));
  ZEROD_RETURN_IF_ERROR(Field(o, "beta1", adam.beta1));
  ZEROD_RETURN_IF_ERROR(Field(o, "beta2", adam.beta2));
  ZEROD_RETURN_IF_ERROR(Field(o, "eps", adam.eps));
  ZEROD_RETURN_IF_ERROR(Field(o, "weight_decay", adam.weight_decay));
  ZEROD_RETURN_IF_ERROR(Field(o, "adamw", adam.decoupled_weight_decay));
  ZEROD_RETURN_IF_ERROR(Field(o, "max_grad_norm", options.max_grad_norm));
  ZEROD_RETURN_IF_ERROR(Field(o, "accumulation_steps", options.accumulation_steps));
  ZEROD_RETURN_IF_ERROR(Field(o, "average_accumulation", options.average_accumulation));
  ZEROD_RETURN_IF_ERROR(Field(o, "threads", options.threads));
  constexpr double kHuge = 1e300;
  ZEROD_RETURN_IF_ERROR(InRange("lr", adam.lr, 0, kHuge, false, "lr >= 0"));
  ZEROD_RETURN_IF_ERROR(InRange("beta1", adam.beta1, 0, 1, true, "0 <= beta1 < 1"));
  ZEROD_RETURN_IF_ERROR(InRange("beta2", adam.beta2, 0, 1, true, "0 <= beta2 < 1"));
  ZEROD_RETURN_IF_ERROR(InRange("eps", adam.eps, 0, kHuge, false, "eps >= 0"));
  ZEROD_RETURN_IF_ERROR(
      InRange("weight_decay", adam.weight_decay, 0, kHuge, false, "weight_decay >= 0"));
  ZEROD_RETURN_IF_ERROR(
      InRange("max_grad_norm", options.max_grad_norm, 0, kHuge, false, "max_grad_norm >= 0"));
  if (options.accumulation_steps < 1) {
    return Invalid(
        absl::StrCat("accumulation_steps: ", options.accumulation_steps, " (expected at least 1)"));
  }
  if (options.threads < 1 || options.threads > 1024) {
    return Invalid(absl::StrCat("threads: ", options.threads, " (expected 1 to 1024)"));
  }
  if (auto scale = o.find("loss_scale"); scale != o.end()) {
    if (!scale->is_object()) return Invalid("loss_scale: expected an object");
    zerod::engine::LossScaleOptions& ls = options.loss_scale;
    ZEROD_RETURN_IF_ERROR(KnownKeys(*scale, "loss_scale",
                                    {"enabled", "initial_scale", "growth_interval", "hysteresis"}));
    ZEROD_RETURN_IF_ERROR(Field(*scale, "enabled", ls.enabled));
    ZEROD_RETURN_IF_ERROR(Field(*scale, "initial_scale", ls.initial_scale));
    ZEROD_RETURN_IF_ERROR(Field(*scale, "growth_interval", ls.growth_interval));
    ZEROD_RETURN_IF_ERROR(Field(*scale, "hysteresis", ls.hysteresis));
    ZEROD_RETURN_IF_ERROR(
        InRange("initial_scale", ls.initial_scale, 1, kHuge, false, "initial_scale >= 1"));
    if (ls.growth_interval < 1 || ls.hysteresis < 1) {
      return Invalid("loss_scale: growth_interval and hysteresis must be at least 1");
    }
  }
  return options;
}

// A copy of `bytes` in memory the caller frees with zerod_free (NUL-terminated, for text).
absl::StatusOr<char*> Copy(const std::string& bytes) {
  char* out = static_cast<char*>(std::malloc(bytes.size() + 1));
  if (out == nullptr) return absl::ResourceExhaustedError("out of memory");
  std::memcpy(out, bytes.data(), bytes.size());
  out[bytes.size()] = '\0';
  return out;
}

json MemoryJson(const zerod::plan::MemoryBreakdown& memory) {
  json out = json::object();
  for (int c = 0; c < zerod::plan::kMemoryCategoryCount; ++c) {
    const auto category = static_cast<zerod::plan::MemoryCategory>(c);
    out[std::string(zerod::plan::MemoryCategoryName(category))] = memory[category];
  }
  return out;
}

}  // namespace

extern "C" {

const char* zerod_last_error(void) { return zerod::c_api::internal::LastError().c_str(); }

void zerod_free(char* text) { std::free(text); }

int zerod_session_start(const char* options_json, zerod_session** out) {
  if (out == nullptr) return Fail(Invalid("no output pointer"));
  *out = nullptr;
  auto options = ParseSessionOptions(options_json);
  if (!options.ok()) return Fail(options.status());
  auto session = zerod::client::TrainerSession::Start(*std::move(options));
  if (!session.ok()) return Fail(session.status());
  *out = new zerod_session{*std::move(session), nullptr};
  return Report(absl::OkStatus());
}

void zerod_session_destroy(zerod_session* session) { delete session; }

int zerod_session_leave(zerod_session* s) {
  if (s == nullptr) return Fail(Invalid("no session (NULL)"));
  return Report(s->session->Leave());
}

int zerod_session_describe(zerod_session* s, char** out) {
  if (s == nullptr) return Fail(Invalid("no session (NULL)"));
  const zerod::plan::ShardPlan& plan = *s->session->plan();
  json units = json::array();
  for (const zerod::plan::TensorPlacement& place : plan.placements())
    units.push_back(place.segment);
  json d = {{"rank", s->session->rank()},
            {"world_size", s->session->world_size()},
            {"generation", s->session->generation()},
            {"job", s->session->job_id()},
            {"peer_address", s->session->PeerAddress()},
            {"device", s->session->device()},
            {"stage", plan.stage()},
            {"param_dtype", std::string(zerod::DTypeName(plan.options().param_dtype))},
            {"grad_dtype", std::string(zerod::DTypeName(plan.options().grad_dtype))},
            {"num_units", plan.segments().size()},
            {"tensor_units", units},
            {"total_numel", plan.total_numel()},
            {"model_state_bytes", plan.MemoryForRank(s->session->rank()).ModelState()},
            {"planned_bytes", plan.MemoryForRank(s->session->rank()).Total()},
            {"memory", MemoryJson(plan.MemoryForRank(s->session->rank()))}};
  return ReturnJson(d, out);
}

int zerod_engine_create(zerod_session* s, const char* options_json) {
  if (s == nullptr) return Fail(Invalid("no session (NULL)"));
  auto options = ParseEngineOptions(options_json);
  if (!options.ok()) return Fail(options.status());
  auto engine = s->session->CreateEngine(*std::move(options));
  if (!engine.ok()) return Fail(engine.status());
  s->engine = *engine;
  return Report(absl::OkStatus());
}

int zerod_engine_init_from(zerod_session* s, int64_t root, const float* const* tensors) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  const int64_t count = static_cast<int64_t>(s->engine->plan().tensors().size());
  if (s->engine->rank() == root && tensors == nullptr) {
    return Fail(Invalid("the root rank gives no tensors"));
  }
  return Report(Synced(s, s->engine->InitParametersFrom(root, [&](int64_t t, float* out) {
    if (t >= count || tensors[t] == nullptr) return;
    const int64_t n = s->engine->plan().placements()[static_cast<size_t>(t)].numel;
    std::memcpy(out, tensors[t], static_cast<size_t>(n) * sizeof(float));
  })));
}

int zerod_engine_broadcast(zerod_session* s, float* values, int64_t count, int64_t root) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  if (values == nullptr && count > 0) return Fail(Invalid("no values (NULL)"));
  return Report(s->engine->Broadcast(values, count, root));
}

int zerod_engine_gather(zerod_session* s, int64_t unit) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  return Report(Synced(s, s->engine->Gather(unit)));
}

int zerod_engine_release(zerod_session* s, int64_t unit) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  return Report(s->engine->Release(unit));
}

int zerod_engine_param(zerod_session* s, int64_t tensor, void** data) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  if (data == nullptr) return Fail(Invalid("no output pointer"));
  auto view = s->engine->Param(tensor);
  if (!view.ok()) return Fail(view.status());
  *data = view->data;
  return Report(absl::OkStatus());
}

int zerod_engine_accumulate_grad(zerod_session* s, int64_t tensor, const float* grad) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  return Report(s->engine->AccumulateGrad(tensor, grad));
}

int zerod_engine_step(zerod_session* s, double lr, int* applied, double* grad_norm,
                      double* loss_scale) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  std::optional<double> rate;
  if (lr >= 0) rate = lr;
  auto result = s->engine->Step(rate);
  if (!result.ok()) return Fail(result.status());
  if (applied != nullptr) *applied = result->applied ? 1 : 0;
  if (grad_norm != nullptr) *grad_norm = result->grad_norm;
  if (loss_scale != nullptr) *loss_scale = result->loss_scale;
  return Report(Synced(s, absl::OkStatus()));
}

int zerod_engine_loss_scale(zerod_session* s, double* scale) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  if (scale == nullptr) return Fail(Invalid("no output pointer"));
  *scale = s->engine->loss_scale();
  return Report(absl::OkStatus());
}

int zerod_engine_average(zerod_session* s, double value, double* mean) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  if (mean == nullptr) return Fail(Invalid("no output pointer"));
  auto result = s->engine->Average(value);
  if (!result.ok()) return Fail(result.status());
  *mean = *result;
  return Report(absl::OkStatus());
}

int zerod_engine_full_parameters(zerod_session* s, float* out, int64_t count) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  const int64_t total = s->engine->plan().total_numel();
  if (out == nullptr || count != total) {
    return Fail(Invalid(absl::StrCat("full parameters: the model has ", total,
                                     " elements, the output holds ", count)));
  }
  auto full = s->engine->FullMasterParameters();
  if (!full.ok()) return Fail(full.status());
  std::memcpy(out, full->data(), static_cast<size_t>(total) * sizeof(float));
  return Report(absl::OkStatus());
}

int zerod_engine_stats(zerod_session* s, char** out) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  json sent = json::object();
  for (const auto& [name, bytes] : s->engine->BytesSent()) sent[name] = bytes;
  json d = {{"step", s->engine->step()},
            {"allocated_bytes", s->engine->AllocatedBytes()},
            {"memory", MemoryJson(s->engine->MemoryByCategory())},
            {"model_state_bytes", s->engine->MemoryByCategory().ModelState()},
            {"gather_overflows", s->engine->gather_overflows()},
            {"peak_gather_buffers", s->engine->peak_gather_buffers()},
            {"pulls_gathers", s->engine->pulls_gathers()},
            {"bytes_pulled", s->engine->bytes_pulled()},
            {"bytes_sent", sent}};
  return ReturnJson(d, out);
}

int zerod_engine_synchronize(zerod_session* s) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  return Report(Synced(s, absl::OkStatus()));
}

int zerod_engine_save(zerod_session* s, const char* root, int64_t keep_last, int record,
                      const char* user, const char* extra, int64_t extra_len, int64_t* step_out,
                      char** directory_out) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  if (root == nullptr || *root == '\0') return Fail(Invalid("save: no root directory"));
  if (step_out == nullptr) return Fail(Invalid("no output pointer"));
  if (extra_len < 0 || (extra == nullptr && extra_len > 0)) {
    return Fail(Invalid(absl::StrCat("save: extra is ", extra == nullptr ? "NULL" : "given",
                                     " with extra_len ", extra_len)));
  }
  zerod::checkpoint::SaveOptions options;
  options.root = root;
  options.keep_last = keep_last;
  options.record = record != 0;
  if (user != nullptr) options.user = user;
  if (extra_len > 0) options.extra.assign(extra, static_cast<size_t>(extra_len));
  auto saved = s->session->SaveCheckpoint(std::move(options));
  if (!saved.ok()) return Fail(saved.status());
  if (directory_out != nullptr) {
    auto dir = Copy(saved->directory);
    if (!dir.ok()) return Fail(dir.status());
    *directory_out = *dir;
  }
  *step_out = saved->step;
  return Report(absl::OkStatus());
}

namespace {

// Load and resume: checks the outputs, runs `load`, and hands out what it loaded.
int LoadInto(
    zerod_session* s, const char* what,
    const std::function<absl::StatusOr<std::optional<zerod::checkpoint::LoadedCheckpoint>>()>& load,
    int64_t* step_out, char** user_out, char** extra_out, int64_t* extra_len_out,
    char** directory_out) {
  if (step_out == nullptr) return Fail(Invalid(absl::StrCat(what, ": no output pointer")));
  for (char** out : {user_out, extra_out, directory_out}) {
    if (out != nullptr) *out = nullptr;
  }
  if (extra_len_out != nullptr) *extra_len_out = 0;
  *step_out = -1;
  auto loaded = load();
  if (!loaded.ok()) return Fail(loaded.status());
  if (!loaded->has_value()) return Report(absl::OkStatus());
  const zerod::checkpoint::LoadedCheckpoint& l = **loaded;
  // All or nothing: the caller frees what it gets only on success.
  std::vector<std::pair<char**, const std::string*>> outs = {
      {user_out, &l.manifest.user}, {extra_out, &l.extra}, {directory_out, &l.directory}};
  for (size_t i = 0; i < outs.size(); ++i) {
    if (outs[i].first == nullptr) continue;
    auto copy = Copy(*outs[i].second);
    if (!copy.ok()) {
      for (size_t j = 0; j < i; ++j) {
        if (outs[j].first != nullptr) {
          std::free(*outs[j].first);
          *outs[j].first = nullptr;
        }
      }
      return Fail(copy.status());
    }
    *outs[i].first = *copy;
  }
  if (extra_len_out != nullptr) *extra_len_out = static_cast<int64_t>(l.extra.size());
  *step_out = l.step;
  return Report(Synced(s, absl::OkStatus()));
}

}  // namespace

int zerod_engine_load(zerod_session* s, const char* path, int64_t* step_out, char** user_out,
                      char** extra_out, int64_t* extra_len_out, char** directory_out) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  if (path == nullptr || *path == '\0') return Fail(Invalid("load: no checkpoint path"));
  return LoadInto(
      s, "load", [&] { return s->session->LoadCheckpoint(path); }, step_out, user_out, extra_out,
      extra_len_out, directory_out);
}

int zerod_engine_resume(zerod_session* s, const char* snapshots, const char* roots,
                        int64_t* step_out, char** user_out, char** extra_out,
                        int64_t* extra_len_out, char** directory_out) {
  if (absl::Status need = NeedEngine(s); !need.ok()) return Fail(need);
  zerod::checkpoint::ResumeRoots where;
  if (snapshots != nullptr) where.snapshots = snapshots;
  if (roots != nullptr) where.durable = absl::StrSplit(roots, '\n', absl::SkipEmpty());
  if (where.snapshots.empty() && where.durable.empty()) {
    return Fail(Invalid("resume: no snapshot directory and no checkpoint roots"));
  }
  return LoadInto(
      s, "resume", [&] { return s->session->ResumeCheckpoint(where); }, step_out, user_out,
      extra_out, extra_len_out, directory_out);
}

}  // extern "C"
