// train_mlp: trains the example MLP with ZeRO under a zerod job, or unsharded with --reference.
//
//   zerorun -n 4 -- build/bin/train_mlp --stage 3 --steps 20 --dtype bf16 --seed 1
//   build/bin/train_mlp --reference --world 4 --steps 20 --dtype bf16 --seed 1
//   zerorun -n 1 -- build/bin/train_mlp --device cuda:0 ...   (CUDA builds: GPU buffers, NCCL)
//
// Every rank prints "step S loss L time T ms" (its own samples' loss); rank 0 ends with one JSON
// line: the global final loss, model-state bytes per rank, bytes communicated per step, ...
// --reference runs one process on the whole global batch (what the ranks split), with no daemon:
// the numbers a sharded run must reproduce.
//
// Checkpoints: --checkpoint-dir D --checkpoint-every N saves a sharded checkpoint every N steps
// (keeping --keep-last); under `zerorun --max-restarts` it also snapshots every step into
// $ZEROD_SNAPSHOT_DIR (shared memory). --resume, or any restart (ZEROD_RESTART > 0), first loads
// the newest complete one of the two, resharded to this world, and goes on from its step: step S
// trains on global batch S whatever the world, so no sample is skipped or seen twice.
// --kill-rank-at R:K is failure injection: on the first attempt rank R kills itself (SIGKILL)
// right after step K; --kill-rank-in-save R:K in the middle of writing its file of step K's save.

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <tuple>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/environment.h"
#include "client/trainer_session.h"
#include "examples/mlp_model.h"
#include "nlohmann/json.hpp"
#include "runtime/checkpoint/checkpoint_files.h"
#include "runtime/checkpoint/save_protocol.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/common/units.h"

namespace {

using namespace zerod;

int Fail(int64_t rank, const absl::Status& s) {
  std::cerr << "train_mlp: rank " << rank << ": " << s.message() << std::endl;
  return 1;
}

// Rounded for people: a step time to the microsecond, not to 17 digits.
double RoundTo(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

// The unsharded reference: the layout as one stage-0 rank with a communicator of its own.
absl::StatusOr<engine::ZeroEngine*> ReferenceEngine(const std::vector<plan::TensorSpec>& layout,
                                                    const plan::PlanOptions& plan_options,
                                                    const engine::EngineOptions& options,
                                                    std::unique_ptr<comm::Communicator>& comm,
                                                    std::unique_ptr<engine::ZeroEngine>& engine) {
  plan::PlanInput input{layout, plan_options};
  input.options.world_size = 1;
  input.options.stage = 0;
  auto plan = plan::ShardPlan::Create(input);
  if (!plan.ok()) return plan.status();
  auto c = comm::GlooCommunicator::Create(std::make_shared<comm::InMemoryStore>(), 0, 1, {});
  if (!c.ok()) return c.status();
  comm = *std::move(c);
  auto e = engine::ZeroEngine::Create(std::make_shared<const plan::ShardPlan>(*std::move(plan)),
                                      comm.get(), options);
  if (!e.ok()) return e.status();
  engine = *std::move(e);
  return engine.get();
}

// Where and how often a run saves: the durable checkpoints, or the in-memory snapshots (not
// recorded by the coordinator: they do not outlive the node).
struct SaveSchedule {
  std::string root;
  int64_t every = 0;
  int64_t keep_last = 0;
  bool record = true;
};

absl::Status SaveIfDue(client::TrainerSession& session, int64_t step, const SaveSchedule& when) {
  if (when.root.empty() || when.every <= 0 || step % when.every != 0) return absl::OkStatus();
  checkpoint::SaveOptions options;
  options.root = when.root;
  options.keep_last = when.keep_last;
  options.record = when.record;
  options.user = nlohmann::json{{"next_batch", step + 1}}.dump();
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<checkpoint::SavedCheckpoint> saved = session.SaveCheckpoint(options);
  if (!saved.ok()) return saved.status();
  if (session.rank() == 0) {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("saved step %ld to %s: %ld bytes in %.1f ms\n", static_cast<long>(step),
                saved->directory.c_str(), static_cast<long>(saved->bytes), ms);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// Loads the newest complete checkpoint of the in-memory snapshots and the durable checkpoints (a
// tie read from memory) and returns its step, or 0 when there is none.
absl::StatusOr<int64_t> ResumeFromNewest(client::TrainerSession& session,
                                         const std::string& snapshots, const std::string& durable) {
  checkpoint::ResumeRoots roots{snapshots, {}};
  if (!durable.empty()) roots.durable.push_back(durable);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::optional<checkpoint::LoadedCheckpoint>> found =
      roots.snapshots.empty() && roots.durable.empty()
          ? std::optional<checkpoint::LoadedCheckpoint>()
          : session.ResumeCheckpoint(roots);
  if (!found.ok()) return found.status();
  if (!found->has_value()) {
    std::printf("rank %ld: no checkpoint to resume from; starting at step 1\n",
                static_cast<long>(session.rank()));
    return 0;
  }
  const checkpoint::LoadedCheckpoint* loaded = &**found;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "rank %ld: resumed from step %ld (%s, saved by %ld ranks at stage %d) in %.1f ms (reading "
      "%.1f ms)\n",
      static_cast<long>(session.rank()), static_cast<long>(loaded->step), loaded->directory.c_str(),
      static_cast<long>(loaded->manifest.world_size), loaded->manifest.stage, ms,
      absl::ToDoubleMilliseconds(loaded->read_time));
  std::fflush(stdout);
  return loaded->step;
}

// Failure injection: the process dies with its rank file half written (still a .tmp).
absl::Status KillInSave(const std::string& path, int64_t bytes_written) {
  std::printf("failure injection: SIGKILL with %ld bytes of %s written\n",
              static_cast<long>(bytes_written), path.c_str());
  std::fflush(stdout);
  raise(SIGKILL);
  return absl::OkStatus();
}

long PeakRssKib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

}  // namespace

int main(int argc, char** argv) {
  std::string stage_text = "3", dtype_text = "fp32", job, endpoint, device = "cpu";
  int64_t steps = 10, world = 0, batch = 48, accumulation = 1, leave_after = 0;
  std::string checkpoint_dir, kill_rank_at, kill_rank_in_save;
  int64_t checkpoint_every = 0, keep_last = 2, snapshot_every = 1;
  bool resume = false;
  uint64_t seed = 1;
  double lr = 1e-2, clip = 0.0;
  bool reference = false, shared_gathers = false;
  int64_t max_live_units = plan::PlanOptions{}.max_live_units;
  examples::MlpShape shape;
  CLI::App app{"train_mlp: the example MLP trained with ZeRO under zerod"};
  app.add_option("--stage", stage_text, "0, 1, 2, 3 or auto")->capture_default_str();
  app.add_option("--steps", steps, "Optimizer steps")->capture_default_str();
  app.add_option("--dtype", dtype_text, "fp32, bf16 or fp16")->capture_default_str();
  app.add_option("--seed", seed, "Data and initialisation seed")->capture_default_str();
  app.add_option("--job", job, "Job id (default $ZEROD_JOB)");
  app.add_option("--endpoint", endpoint, "zerod endpoint (default $ZEROD_ENDPOINT)");
  app.add_option("--world", world,
                 "Ranks (default $ZEROD_WORLD_SIZE; with --reference: the "
                 "world whose global batch to train on)");
  app.add_option("--batch", batch, "Global batch, split evenly over the ranks")
      ->capture_default_str();
  app.add_option("--accumulation", accumulation, "Micro-steps per step")->capture_default_str();
  app.add_option("--lr", lr, "Adam learning rate")->capture_default_str();
  app.add_option("--clip", clip, "Clip gradients to this global norm (0: off)");
  app.add_option("--hidden", shape.hidden, "Hidden width")->capture_default_str();
  app.add_option("--layers", shape.layers, "Layers (each a stage-3 gather unit)")
      ->capture_default_str();
  app.add_option("--device", device,
                 "cpu, or cuda:N (CUDA builds): the engine's buffers on GPU N, NCCL collectives; "
                 "plain cuda is GPU $ZEROD_LOCAL_RANK")
      ->capture_default_str();
  app.add_option("--leave-after", leave_after,
                 "Leave the job after this step while the others train on, as a script that "
                 "ends early does (0: no)");
  app.add_option("--checkpoint-dir", checkpoint_dir, "Root of the sharded checkpoints");
  app.add_option("--checkpoint-every", checkpoint_every,
                 "Save a checkpoint every N steps (0: never)");
  app.add_option("--keep-last", keep_last, "Checkpoints kept (0: all)")->capture_default_str();
  app.add_option("--snapshot-every", snapshot_every,
                 "In-memory snapshot every N steps when $ZEROD_SNAPSHOT_DIR is set (0: never)")
      ->capture_default_str();
  app.add_flag("--resume", resume,
               "Load the newest complete checkpoint first (always after a restart)");
  app.add_option("--kill-rank-at", kill_rank_at,
                 "Failure injection R:K: on the first attempt rank R kills itself after step K");
  app.add_option("--kill-rank-in-save", kill_rank_in_save,
                 "Failure injection R:K: on the first attempt rank R kills itself in the middle "
                 "of writing its file of step K's checkpoint");
  app.add_option("--max-live-units", max_live_units,
                 "Stage 3: most units (layers) gathered at once; as many as --layers keeps "
                 "backward from gathering them again")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1023}));
  app.add_flag("--shared-gathers", shared_gathers,
               "Stage 3: gathers share the main communicator instead of their own");
  app.add_flag("--reference", reference, "Unsharded single-process run, no daemon");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "train_mlp: " << e.what() << std::endl;
    return 2;
  }
  auto dtype = ParseDType(dtype_text);
  if (!dtype.ok()) {
    std::cerr << "train_mlp: --dtype: " << dtype.status().message() << std::endl;
    return 2;
  }
  int stage = plan::kAutoStage;
  if (stage_text != "auto") {
    if (stage_text.size() != 1 || stage_text[0] < '0' || stage_text[0] > '3') {
      std::cerr << "train_mlp: --stage: expected 0, 1, 2, 3 or auto, got '" << stage_text << "'"
                << std::endl;
      return 2;
    }
    stage = stage_text[0] - '0';
  }
  if (const absl::StatusOr<int> d = client::ParseDevice(device); !d.ok()) {
    std::cerr << "train_mlp: --device: " << d.status().message() << std::endl;
    return 2;
  }
  if (steps < 1 || batch < 1 || accumulation < 1 || shape.layers < 1 || shape.hidden < 1) {
    std::cerr << "train_mlp: --steps, --batch, --accumulation, --layers and --hidden must be "
                 "at least 1"
              << std::endl;
    return 2;
  }
  int64_t kill_rank = -1, kill_step = 0, kill_save_rank = -1, kill_save_step = 0;
  for (auto [flag, text, r, k] :
       {std::tuple{"--kill-rank-at", &kill_rank_at, &kill_rank, &kill_step},
        std::tuple{"--kill-rank-in-save", &kill_rank_in_save, &kill_save_rank, &kill_save_step}}) {
    if (!text->empty() && std::sscanf(text->c_str(), "%ld:%ld", r, k) != 2) {
      std::cerr << "train_mlp: " << flag << ": expected R:K, got '" << *text << "'" << std::endl;
      return 2;
    }
  }
  const int64_t attempt = std::atoll(client::Env("ZEROD_RESTART").c_str());
  if (attempt > 0) resume = true;
  const std::string snapshot_dir = client::Env("ZEROD_SNAPSHOT_DIR");
  if (reference && (resume || !checkpoint_dir.empty())) {
    std::cerr << "train_mlp: --reference runs without checkpoints" << std::endl;
    return 2;
  }
  plan::PlanOptions plan_options;
  plan_options.stage = stage;
  plan_options.param_dtype = *dtype;
  plan_options.grad_dtype = *dtype;
  plan_options.reduce_bucket_bytes = 64 << 10;  // small buckets: a small model still overlaps
  plan_options.max_live_units = max_live_units;
  const std::vector<plan::TensorSpec> layout = examples::MlpLayout(shape, *dtype);

  // The engine: under a session (which makes and wires it), or (reference) on one local rank.
  std::unique_ptr<client::TrainerSession> session;
  std::unique_ptr<comm::Communicator> local_comm;
  std::unique_ptr<engine::ZeroEngine> local_engine;
  engine::ZeroEngine* e = nullptr;
  engine::EngineOptions engine_options;
  engine_options.adam.lr = lr;
  engine_options.max_grad_norm = clip;
  engine_options.accumulation_steps = accumulation;
  int64_t rank = 0;
  if (reference) {
    if (world == 0) world = 1;
    absl::StatusOr<engine::ZeroEngine*> created =
        ReferenceEngine(layout, plan_options, engine_options, local_comm, local_engine);
    if (!created.ok()) return Fail(0, created.status());
    e = *created;
  } else {
    client::SessionOptions options;
    options.endpoint = endpoint;
    options.job_id = job;
    options.world_size = world;
    options.device = device;
    options.gather_communicator = !shared_gathers;
    options.layout = layout;
    options.plan_options = plan_options;
    auto s = client::TrainerSession::Start(options);
    if (!s.ok()) {
      // No rank was given yet: name the job, and the rank asked for when there was one (from
      // the flags, else the ZEROD_* environment the session read them from).
      const std::string asked = client::Env("ZEROD_RANK");
      std::cerr << "train_mlp: job " << (job.empty() ? client::Env("ZEROD_JOB") : job) << " (world "
                << (world == 0 ? client::Env("ZEROD_WORLD_SIZE") : std::to_string(world)) << ")"
                << (asked.empty() ? "" : absl::StrCat(", rank ", asked))
                << ": the session did not start: " << s.status().message() << std::endl;
      return 1;
    }
    session = *std::move(s);
    rank = session->rank();
    world = session->world_size();
    if (device == "cpu") {
      std::printf("rank %ld of %ld: peers reach it at %s\n", static_cast<long>(rank),
                  static_cast<long>(world), session->PeerAddress().c_str());
    }
    absl::StatusOr<engine::ZeroEngine*> created = session->CreateEngine(engine_options);
    if (!created.ok()) return Fail(rank, created.status());
    e = *created;
  }
  const plan::ShardPlan& plan = e->plan();
  if (batch % world != 0) {
    return Fail(rank, absl::InvalidArgumentError(absl::StrCat(
                          "--batch ", batch, " does not split evenly over ", world, " ranks")));
  }
  const int64_t local = reference ? batch : batch / world;
  const int64_t first_sample = reference ? 0 : rank * local;

  absl::Status status =
      e->InitParameters([&](int64_t t, float* out) { examples::MlpInit(shape, seed, t, out); });
  if (!status.ok()) return Fail(rank, status);
  // The model computes on the host; on a GPU its gradients go up through one staging buffer.
  std::optional<engine::Buffer> staging;
  if (session && session->device_ops()) {
    int64_t largest = 0;
    for (const plan::TensorSpec& t : layout) largest = std::max(largest, t.numel());
    auto b = engine::Buffer::Allocate(session->device_ops(), DType::kFloat32, largest);
    if (!b.ok()) return Fail(rank, b.status());
    staging = *std::move(b);
  }

  int64_t first_step = 1;
  if (session && resume) {
    absl::StatusOr<int64_t> loaded = ResumeFromNewest(*session, snapshot_dir, checkpoint_dir);
    if (!loaded.ok()) return Fail(rank, loaded.status());
    first_step = *loaded + 1;
  }

  const examples::Dataset data(shape, seed);
  double last_loss = 0, total_ms = 0, total_step_ms = 0;
  // Where the steps after the first went: forward and backward (with the stage-3 gathers they
  // waited for), the optimizer step, and the time blocked on collectives by kind.
  std::map<std::string, double> waits_before;
  examples::MicroStepBuffers buffers;
  for (int64_t step = first_step; step <= steps; ++step) {
    if (step == first_step + 1) waits_before = e->CollectiveWaitSeconds();
    const auto start = std::chrono::steady_clock::now();
    double loss = 0;
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      // Micro-steps of one step use consecutive blocks of the global sample stream.
      const examples::Batch b = data.Make(step * accumulation + micro, first_sample, local);
      auto micro_loss =
          examples::TrainMicroStep(shape, *e, b, buffers, staging ? &*staging : nullptr);
      if (!micro_loss.ok()) return Fail(rank, micro_loss.status());
      loss += *micro_loss / static_cast<double>(accumulation);
    }
    const auto stepping = std::chrono::steady_clock::now();
    absl::StatusOr<engine::StepResult> result = e->Step();
    if (!result.ok()) return Fail(rank, result.status());
    const auto end = std::chrono::steady_clock::now();
    const double ms = std::chrono::duration<double, std::milli>(end - start).count();
    if (step > first_step) {
      total_ms += ms;
      total_step_ms += std::chrono::duration<double, std::milli>(end - stepping).count();
    }
    last_loss = loss;
    std::printf("step %ld loss %.6f time %.2f ms%s\n", static_cast<long>(step), loss, ms,
                result->applied ? "" : " (skipped: gradient overflow)");
    std::fflush(stdout);
    if (session) {
      if (attempt == 0 && rank == kill_save_rank && step == kill_save_step) {
        checkpoint::SetSaveFailureInjectionForTesting(&KillInSave);
      }
      // A snapshot that fails (shared memory full) costs the fast restart, not the run: every
      // rank gets the same error and trains on; the durable checkpoint is the fallback.
      status = SaveIfDue(*session, step, {snapshot_dir, snapshot_every, 2, false});
      if (!status.ok()) {
        std::fprintf(stderr, "train_mlp: rank %ld: snapshot of step %ld skipped: %s\n",
                     static_cast<long>(rank), static_cast<long>(step),
                     std::string(status.message()).c_str());
      }
      status = SaveIfDue(*session, step, {checkpoint_dir, checkpoint_every, keep_last, true});
      if (!status.ok()) return Fail(rank, status);
      if (attempt == 0 && rank == kill_rank && step == kill_step) {
        std::printf("rank %ld: failure injection: SIGKILL after step %ld\n",
                    static_cast<long>(rank), static_cast<long>(step));
        std::fflush(stdout);
        raise(SIGKILL);
      }
    }
    if (session && step == leave_after) {
      status = session->Leave();
      if (!status.ok()) return Fail(rank, status);
      std::printf("rank %ld left the job after step %ld\n", static_cast<long>(rank),
                  static_cast<long>(step));
      return 0;
    }
  }
  const std::map<std::string, double> waits_after = e->CollectiveWaitSeconds();
  std::map<std::string, int64_t> sent = e->BytesSent();
  int64_t sent_total = 0;
  for (const auto& [name, bytes] : sent) sent_total += bytes;
  // The global final loss: the mean of every rank's (equal-sized) batch loss.
  float global_loss = static_cast<float>(last_loss);
  if (session) {
    absl::StatusOr<double> mean = e->Average(last_loss);
    if (!mean.ok()) return Fail(rank, mean.status());
    global_loss = static_cast<float>(*mean);
  }
  const int64_t steps_run = steps - first_step + 1;
  const double timed_steps = static_cast<double>(std::max<int64_t>(steps_run - 1, 1));
  const double step_time_ms = steps_run > 1 ? total_ms / timed_steps : 0.0;
  nlohmann::json breakdown = {
      {"forward_backward_ms", RoundTo((total_ms - total_step_ms) / timed_steps, 3)},
      {"optimizer_step_ms", RoundTo(total_step_ms / timed_steps, 3)}};
  for (const auto& [kind, seconds] : waits_after) {
    breakdown["wait_ms"][kind] = RoundTo((seconds - waits_before[kind]) * 1e3 / timed_steps, 3);
  }
  if (steps_run < 2) breakdown = nullptr;  // the first step (setup, first gathers) is not timed
  // Every rank's own breakdown: a rank's waits include the time its peers took to get there.
  std::printf("rank %ld: peak_rss_kib %ld, step_time_ms %.3f, step_breakdown %s\n",
              static_cast<long>(rank), PeakRssKib(), step_time_ms, breakdown.dump().c_str());
  if (rank == 0) {
    const plan::MemoryBreakdown memory = e->MemoryByCategory();
    nlohmann::json out = {
        {"job", session ? session->job_id() : "reference"},
        {"reference", reference},
        {"stage", plan.stage()},
        {"world_size", world},
        {"device", session ? session->device() : std::string("cpu")},
        {"gather_communicator", session && session->has_gather_communicator()},
        {"shard_exchange", session && session->has_shard_exchange()},
        {"shared_memory", session && session->uses_shared_memory()},
        {"shared_memory_pieces", session ? session->shared_memory_pieces() : 0},
        {"background_start", session && session->starts_collectives_in_background()},
        {"dtype", std::string(DTypeName(*dtype))},
        {"steps", steps},
        {"params", plan.total_numel()},
        {"final_loss", global_loss},
        {"model_state_bytes_per_rank", memory.ModelState()},
        {"allocated_bytes_per_rank", e->AllocatedBytes()},
        {"paper_model_state_bytes_per_rank", std::llround(plan.PaperModelStateBytes())},
        {"comm_bytes_per_step", sent_total / std::max<int64_t>(steps_run, 1)},
        {"first_step", first_step},
        {"comm_bytes_by_collective", sent},
        {"step_time_ms", RoundTo(step_time_ms, 3)},
        {"step_breakdown", breakdown},
        {"peak_rss_kib", PeakRssKib()},
        {"plan_digest", plan.DigestHex()}};
    std::printf("%s\n", out.dump().c_str());
  }
  if (session) {
    status = session->Leave();
    if (!status.ok()) return Fail(rank, status);
  }
  return 0;
}
