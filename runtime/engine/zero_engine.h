#ifndef ZEROD_RUNTIME_ENGINE_ZERO_ENGINE_H_
#define ZEROD_RUNTIME_ENGINE_ZERO_ENGINE_H_

// ZeroEngine: ZeRO stages 0-3 for one rank, executed under a ShardPlan.
//
// The engine owns the flat buffers the plan lists, allocated at their planned sizes and no more;
// model tensors are views into them. A training step on the model's side:
//
//   for each micro-step:                 (options.accumulation_steps of them)
//     forward:  Gather(unit) / Param(t) ... Release(unit)   (Gather/Release matter at stage 3)
//     backward: AccumulateGrad(t, dL/dt * loss_scale()) for every tensor, last tensor first
//   Step()
//
// Names: the plan cuts the flat parameter buffer into segments, and the engine indexes everything
// by segment. A segment's gradients are reduced as one bucket; at stage 3 the segment is also the
// gather unit, so the "unit" of Gather/Release/UnitOf/num_units is a segment index. "Bucket
// buffer" and "gather buffer" name memory a segment passes through, never an index. Where a
// rank's slice of a segment sits in each buffer comes from the plan (ShardPlan::SliceOf and the
// buffer's BufferLayout), not from arithmetic here.
//
// Gradients of a segment are reduce-scattered as soon as its last tensor arrives (stages 2-3,
// asynchronously, while backward goes on) or reduced at Step (stages 0-1: all-reduce at 0,
// reduce-scatter at 1). Segments of a few hundred KiB cost a collective's latency, not its bytes,
// so small ones that fill back to back go as one grouped reduce-scatter, and a small unit and its
// prefetch as one grouped all-gather (up to kCoalesceBytes in zero_engine.cc). Step unscales,
// checks for overflow on every rank, clips by the global norm, runs Adam on the rank's fp32 shard,
// and all-gathers the new parameters (stages 1-2). Stage 3 gathers a unit on Gather, prefetches the
// next one, and refuses a tensor of a unit that is not gathered. Given a second communicator
// (options.gather_comm), stage 3 runs its gathers there, so a prefetch does not queue behind the
// reduce-scatters of backward.
//
// The trainer's thread drives the engine; each communicator runs collectives on its own thread
// (Gloo) or stream (NCCL). Buffers live where options.device says: host memory by default, GPU
// memory with CudaOps.
// Every rank must make the same calls in the same order (the SPMD contract of Communicator).

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/common/thread_pool.h"
#include "runtime/engine/buffer.h"
#include "runtime/engine/collective_log.h"
#include "runtime/engine/device_ops.h"
#include "runtime/engine/loss_scaler.h"
#include "runtime/engine/shard_exchange.h"
#include "runtime/optim/adam.h"
#include "runtime/plan/shard_plan.h"

namespace zerod::engine {

struct EngineOptions {
  optim::AdamConfig adam;
  // Dynamic loss scaling; enabled automatically when gradients are fp16.
  LossScaleOptions loss_scale;
  double max_grad_norm = 0.0;  // 0: no clipping
  int64_t accumulation_steps = 1;
  // true: the step's gradient is the mean over the micro-steps (DeepSpeed's convention); false:
  // their sum, for a trainer that divides its loss by accumulation_steps itself (plain torch).
  // Either way it is the mean over the ranks, as torch DDP's.
  bool average_accumulation = true;
  int threads = 1;  // optimizer threads (host memory)
  // Where the buffers live: host memory by default; CudaOps (runtime/engine/cuda/) for a GPU,
  // with a communicator on device memory (NCCL) ordered after the ops' stream.
  std::shared_ptr<DeviceOps> device;
  absl::Duration collective_timeout = absl::Seconds(120);
  // When set, ranks compare their collective sequences through this store every `check_every`
  // steps (0: only when a collective fails or times out), so divergence is named, not a hang.
  std::shared_ptr<comm::Store> check_store;
  int64_t check_every = 0;
  // Stage 3: a second communicator over the same ranks for parameter gathers (with NCCL, its own
  // stream; with Gloo, its own thread and connections). A communicator runs its collectives in
  // the order they were issued, so with one communicator the prefetch of the next unit waits for
  // every reduce-scatter issued before it. nullptr: gathers share the main communicator.
  comm::Communicator* gather_comm = nullptr;
  // Stage 3, every rank on one host: the parameter shards in shared memory (shard_exchange.h).
  // Gathers then copy the peers' slices themselves, without a collective, so ranks may gather
  // different units; gather_comm goes unused. Every rank gives one or none.
  std::shared_ptr<ShardExchange> shard_exchange;
  // Applied to every failed collective before the engine returns it, so the caller gets the
  // cause rather than the symptom (the trainer session asks the coordinator which rank was lost).
  // Returns the cause, or `failure` itself when none is known; with `wait` false it answers from
  // what it knows now, with `wait` true it may wait a bounded time for the cause to be known.
  std::function<absl::Status(const absl::Status& failure, bool wait)> explain_failure;
};

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t numel = 0;
};

// Checkpoints see the fp32 training state in model coordinates, which no plan changes: element i
// of the model is element i of the tensors laid end to end, without padding. A run is a range of
// them.
struct ModelRun {
  int64_t offset = 0;
  int64_t numel = 0;
};
// The fp32 state a rank holds per element: the master copy (the parameters in fp32 training) and
// Adam's two moments.
enum class StateTensor : int { kMaster = 0, kAdamM = 1, kAdamV = 2 };
inline constexpr int kStateTensorCount = 3;
// The counters a restored run continues from.
struct TrainingCounters {
  int64_t applied_steps = 0;  // Step() calls that updated the parameters
  int64_t steps_taken = 0;    // applied or skipped
  LossScalerState loss_scaler;
  // Per tensor, in model order: the steps that updated it, which Adam's bias correction counts (a
  // tensor no rank gave a gradient is not stepped, as torch skips a parameter whose grad is None).
  // Empty: every tensor at applied_steps.
  std::vector<int64_t> tensor_steps;
};

// Parameter groups, as torch.optim has them: each with its own hyperparameters, read at every
// Step (so a schedule may change any of them between steps).
struct ParamGroups {
  std::vector<optim::AdamConfig> configs;  // one per group
  // Per tensor, in model order: its group (an index into configs), or kNotOptimized.
  std::vector<int32_t> tensor_group;
};
inline constexpr int32_t kNotOptimized = -1;

struct StepResult {
  bool applied = false;  // false: skipped on every rank (gradient overflow)
  double grad_norm = 0;  // global, unscaled, before clipping
  double loss_scale = 1;
};

class ZeroEngine {
 public:
  static absl::StatusOr<std::unique_ptr<ZeroEngine>> Create(
      std::shared_ptr<const plan::ShardPlan> plan, comm::Communicator* comm, EngineOptions options);
  ~ZeroEngine();

  const plan::ShardPlan& plan() const { return *plan_; }
  int64_t rank() const { return rank_; }
  // Step() calls completed so far, applied or skipped (gradient overflow). step(),
  // MemoryByCategory() and BytesSent() may be read from any thread (a heartbeat thread does), the
  // rest only from the trainer's.
  int64_t step() const { return steps_taken_.load(std::memory_order_relaxed); }
  double loss_scale() const { return scaler_.scale(); }

  // Sets initial parameters: init(tensor, out) writes the whole tensor in fp32 (every rank
  // computes the same values); the engine keeps what this rank holds.
  absl::Status InitParameters(const std::function<void(int64_t, float*)>& init);
  // Sets initial parameters from rank `root`'s values, as data-parallel wrappers start (torch DDP
  // broadcasts rank 0's module): init is called on `root` only, and the values are broadcast (a
  // collective: every rank calls it), in batches of tensors of up to `batch_numel` elements (16 MiB
  // of fp32; or one larger tensor),
  // so what it holds on the way is a batch, not the model.
  absl::Status InitParametersFrom(int64_t root, const std::function<void(int64_t, float*)>& init,
                                  int64_t batch_numel = int64_t{4} << 20);
  // Rank `root`'s `count` floats (host memory) into every rank's `values`, through the
  // communicator's memory (a collective; checked and explained as every collective is). For
  // state outside the plan, such as a module's buffers.
  absl::Status Broadcast(float* values, int64_t count, int64_t root);

  // Stage 3: Gather(unit) materialises a unit's parameters (waiting for them) and prefetches the
  // next unit in the direction of travel. Release(unit) ends its use: Param() refuses it from
  // then on, but its buffer keeps it until a gather needs the buffer, so gathering it again before
  // then costs no all-gather. A gather or prefetch takes a free buffer, else displaces a prefetch
  // nobody asked for, else the unit released longest ago. When every buffer holds a unit not
  // released, a gather takes one more buffer beyond the plan's max_live_units (a prefetch never
  // does), which goes back as soon as a release leaves more buffers than planned: the plan's
  // count is a budget kept whenever the caller's releases allow, never a reason to fail.
  // Step() and every write of the parameters (InitParameters*, a restore) drop every gathered
  // unit. Since which unit is displaced decides which all-gathers run, every rank must Gather and
  // Release in the same order (as it must issue every collective). Below stage 3 both are no-ops.
  int64_t UnitOf(int64_t tensor) const;
  int64_t num_units() const { return static_cast<int64_t>(plan_->segments().size()); }
  absl::Status Gather(int64_t unit);
  absl::Status Release(int64_t unit);
  // Gathers that took a buffer beyond the plan's, and the most gather buffers held at once.
  int64_t gather_overflows() const { return gather_overflows_; }
  int64_t peak_gather_buffers() const { return peak_gather_buffers_; }
  // Whether stage-3 gathers copy the peers' shards (EngineOptions::shard_exchange), and the
  // bytes copied from other ranks so far.
  bool pulls_gathers() const { return exchange_ != nullptr; }
  int64_t bytes_pulled() const { return exchange_ ? exchange_->bytes_pulled() : 0; }

  // The tensor's parameters (low precision, or fp32 in fp32 training).
  absl::StatusOr<TensorView> Param(int64_t tensor);
  absl::Status ParamToFloat(int64_t tensor, float* out);
  // Adds a gradient (fp32, already multiplied by loss_scale(), in the engine's memory: a device
  // pointer with CudaOps) for this micro-step. grad == nullptr: this rank has no gradient for the
  // tensor in this micro-step (torch left it None); it counts as zeros in the reduction, and
  // where no rank gives one until the next Step, the tensor is not stepped (see ZeroGrad).
  absl::Status AccumulateGrad(int64_t tensor, const float* grad);
  // One optimizer step with every tensor in one group of options.adam (lr overriding its lr).
  absl::StatusOr<StepResult> Step(std::optional<double> lr = std::nullopt);
  // One optimizer step with each tensor's group's hyperparameters (INVALID_ARGUMENT naming the
  // group or tensor at fault). Tensors to which no rank has given a gradient since the last
  // ZeroGrad(set_to_none) are not stepped, and keep their step count. Step follows the
  // accumulation_steps micro-steps, or none (torch's step() after zero_grad(): the gradients are
  // zeros, or None).
  absl::StatusOr<StepResult> Step(const ParamGroups& groups);
  // torch's optimizer.zero_grad(): discards the gradients given since the last Step (waiting for
  // the reductions in flight), so a Step now sees zeros. set_to_none also forgets which tensors
  // had a gradient, as torch's grads set to None are. Between micro-steps only; no collective.
  absl::Status ZeroGrad(bool set_to_none);

  // Memory held, by category, from the buffers' real sizes; equals the plan's MemoryForRank.
  plan::MemoryBreakdown MemoryByCategory() const;
  int64_t AllocatedBytes() const;
  // By collective, over both communicators.
  std::map<std::string, int64_t> BytesSent() const;
  // Seconds this engine's callers have spent blocked on collectives, by what they waited for:
  // "gather" (stage-3 units), "reduce" (gradients, and the overflow flag with the norm), "update"
  // (the new parameters after a step, stages 1-2), "other" (broadcasts, Average). Where a step's
  // time goes that is not computation. Any thread may read it.
  std::map<std::string, double> CollectiveWaitSeconds() const;

  // The mean of `value` over the ranks (a collective: every rank calls it), e.g. a global loss.
  // Reduced in fp32 in the engine's memory, and checked and explained as every collective is.
  absl::StatusOr<double> Average(double value);

  // The full fp32 parameters in model order, unpadded (a collective: every rank calls it).
  absl::StatusOr<std::vector<float>> FullMasterParameters();

  // Checkpoints (runtime/checkpoint). HeldRuns: the elements whose fp32 state this rank holds,
  // in model order (its real slices at stages 1-3, the whole model at stage 0). SavedRuns: what
  // this rank writes, so that every element is written by exactly one rank: the held runs at
  // stages 1-3, its even share of the model at stage 0, where every rank holds everything.
  std::vector<ModelRun> HeldRuns() const;
  std::vector<ModelRun> SavedRuns() const;
  TrainingCounters counters() const;
  // Copies `run` of a state tensor to or from host memory (run.numel floats). The run must lie
  // inside the held runs (INVALID_ARGUMENT otherwise). Between WriteState calls and
  // FinishRestore the parameters are stale: no forward until FinishRestore.
  absl::Status ReadState(StateTensor which, const ModelRun& run, float* out);
  absl::Status WriteState(StateTensor which, const ModelRun& run, const float* values);
  // After every held element was written: sets the counters, rebuilds the parameters from the
  // master copy (all-gathered at stages 1-2: a collective, every rank calls it), drops gathered
  // units and gradients. The engine then trains on as the saved one would have.
  absl::Status FinishRestore(const TrainingCounters& counters);

 private:
  // One of the plan's buffers, with the layout that says where a slice sits in it.
  struct PlannedBuffer {
    Buffer memory;
    plan::BufferLayout layout = plan::BufferLayout::kFlat;

    char* Slice(const plan::OwnedRange& r) { return memory.at(r.OffsetIn(layout)); }
    float* F32Slice(const plan::OwnedRange& r) { return reinterpret_cast<float*>(Slice(r)); }
  };
  // Per segment.
  struct SegmentState {
    int64_t grads_pending = 0;  // tensors whose gradient this micro-step has yet to bring
    int64_t bucket = -1;        // bucket buffer it is filling, or -1
    int64_t gather = -1;        // gather buffer holding its parameters (stage 3), or -1
  };
  // A collective in flight that several buffers may share (a grouped one): the first wait takes
  // its result, and every later wait on it gets the same.
  struct InFlight {
    std::unique_ptr<comm::Work> work;
    std::optional<absl::Status> result;
  };
  // A bucket buffer: one segment's whole gradients until its reduce-scatter lands in the shard.
  struct BucketBuffer {
    PlannedBuffer buffer;
    int64_t segment = -1;  // filling, full (held_buckets_) or being reduced; -1 when free
    std::shared_ptr<InFlight> reduce;  // the reduce-scatter in flight, if any
  };
  // Collectives of fewer bytes than this cost their latency (a lead exchange, a wake-up of every
  // rank), not their bytes: the segments of back-to-back reduce-scatters, or of a gather and its
  // prefetch, go as one grouped collective while they come to at most this much (figures:
  // bench/RESULTS.md, decision record 0018).
  static constexpr int64_t kCoalesceBytes = int64_t{256} << 10;

  // A gather buffer: one segment's whole parameters (stage 3).
  // A gather buffer holds one unit's parameters from its all-gather until it is needed for
  // another unit or the step changes the parameters. Release only makes it evictable: a unit
  // gathered again before that (backward right after forward) costs no all-gather.
  struct GatherBuffer {
    PlannedBuffer buffer;
    int64_t segment = -1;              // -1 when free
    bool requested = false;            // by Gather and not Released since
    int64_t last_use = 0;              // when it was last requested or released (for LRU)
    std::shared_ptr<InFlight> gather;  // the all-gather in flight, if any
  };

  ZeroEngine(std::shared_ptr<const plan::ShardPlan> plan, comm::Communicator* comm,
             EngineOptions options);
  absl::Status AllocateBuffers();
  // InitParameters for tensors [first, last), without the final Synchronize.
  absl::Status InitTensors(int64_t first, int64_t last,
                           const std::function<void(int64_t, float*)>& init);
  // The one buffer of a category, or nullptr for the bucket and gather buffers (several each).
  PlannedBuffer* SingleBuffer(plan::MemoryCategory category);
  enum class WaitFor { kGather, kReduce, kUpdate, kOther, kCount };
  absl::Status Wait(std::unique_ptr<comm::Work> work, WaitFor what);
  // Waits for a shared collective (once: the result is kept for the others sharing it) and lets
  // go of `in_flight`; OK when it is null.
  absl::Status Wait(std::shared_ptr<InFlight>& in_flight, WaitFor what);
  // Aborts `work` (and so its communicator) and waits until its buffers are let go.
  void GiveUp(comm::Work& work, const absl::Status& why);
  // Every segment's slice of `flat` (a kFlat buffer) for one grouped `collective`, recorded in
  // the collective log segment by segment.
  std::vector<comm::ChunkedBuffer> SegmentsOf(PlannedBuffer& flat, const char* collective,
                                              DType dtype);
  // The cause of a failed collective: a loss already known, else a divergence of the ranks'
  // collective order, else what explain_failure finds given time.
  absl::Status Explain(absl::Status failure);
  // What a failed order check (`check`) and a failed collective (`failure`; OK when the check
  // alone failed) come to: a divergence of the ranks' order is the cause; else a loss that
  // explain_failure names given time; else what was seen.
  absl::Status Blame(const absl::Status& check, const absl::Status& failure);
  absl::Status FinishReduceScatter(BucketBuffer& bucket);
  absl::StatusOr<BucketBuffer*> BucketFor(int64_t segment);
  // A whole segment's bytes in `dtype`, padding included.
  int64_t SegmentBytes(int64_t segment, DType dtype) const {
    return plan_->segments()[static_cast<size_t>(segment)].padded_numel * DTypeBytes(dtype);
  }
  // Whether a segment's gradients of a micro-step that is not over should wait in its bucket to
  // go with the next segments' (kCoalesceBytes): only while another bucket buffer can take the
  // next segment.
  bool HoldReduce() const;
  // One grouped reduce-scatter of every full bucket in held_buckets_.
  void LaunchHeldReduces();
  // One grouped all-gather (or one pull from the shard exchange) of each (segment, gather
  // buffer) pair, and the bookkeeping of the buffers it fills.
  absl::Status LaunchGathers(const std::vector<std::pair<int64_t, int64_t>>& units);
  void MarkGathering(const std::vector<std::pair<int64_t, int64_t>>& units,
                     const std::shared_ptr<InFlight>& in_flight);
  absl::Status WaitGather(int64_t gather);
  // A gather buffer to gather into: a free one, else the one whose unit (not `keep`) is an unused
  // prefetch or was released longest ago, emptied; else, with `grow`, one more beyond the plan's;
  // else -1.
  absl::StatusOr<int64_t> FreeGatherBuffer(int64_t keep, bool grow);
  // Gather buffers holding memory now, and giving back the memory of free ones beyond the plan's.
  int64_t AllocatedGatherBuffers() const;
  void ShrinkGatherBuffers();
  // Frees gather buffer g once its all-gather has landed.
  absl::Status DropGather(int64_t g);
  // Drops every gathered unit (once its all-gather has landed): the parameters are changing.
  absl::Status DropGatheredUnits();
  // The start and end of a write of the parameter shard (ShardExchange's write phases; no-ops
  // without one). Every rank calls them at the same point.
  absl::Status BeginShardWrite();
  void EndShardWrite();
  // The fp32 parameters Adam updates: the master copy, or the parameters in fp32 training.
  PlannedBuffer& Master() { return mixed() ? master_ : params_; }
  PlannedBuffer& State(StateTensor which);
  // Stages 1-2: every rank's slices of the parameters all-gathered into its full copy (after a
  // step or a restore); a no-op at the other stages.
  absl::Status GatherParameters();
  // Step's parts (zero_engine_step.cc). Agreement: what every rank must see alike after the
  // reduction, from one small all-reduce.
  struct Agreement {
    bool overflow = false;
    double sum_squares = 0;            // of the reduced gradients, loss-scaled
    std::vector<bool> tensor_stepped;  // some rank gave the tensor a gradient
  };
  absl::Status CheckGroups(const ParamGroups& groups) const;
  absl::Status ReduceGradients();
  absl::StatusOr<Agreement> Agree(bool need_norm);
  // The Adam runs of this rank's slices: each tensor's part with its group's scalars at its own
  // step count; runs of neighbouring tensors that share their scalars are merged.
  std::vector<optim::AdamRun> AdamRuns(const ParamGroups& groups, const std::vector<bool>& stepped,
                                       float grad_multiplier);
  // A held element range [offset, offset + numel) in model order, where it sits in `slice`.
  struct HeldPiece {
    int64_t model_offset = 0;
    int64_t numel = 0;
    plan::OwnedRange slice;
  };
  std::vector<HeldPiece> HeldPieces() const;
  // Calls fn(piece, offset in the piece, offset in the run, numel) for every part of `run`;
  // INVALID_ARGUMENT when part of it is not held.
  absl::Status ForEachHeld(
      const ModelRun& run,
      const std::function<absl::Status(const HeldPiece&, int64_t, int64_t, int64_t)>& fn) const;
  DType grad_dtype() const { return plan_->options().grad_dtype; }
  DType param_dtype() const { return plan_->options().param_dtype; }
  bool mixed() const { return param_dtype() != DType::kFloat32; }

  const std::shared_ptr<const plan::ShardPlan> plan_;
  comm::Communicator* const comm_;
  comm::Communicator* const gather_comm_;  // comm_ unless options.gather_comm is given
  ShardExchange* const exchange_;          // options.shard_exchange at stage 3, else null
  const EngineOptions options_;
  const int64_t rank_;
  const int stage_;

  std::shared_ptr<DeviceOps> ops_;
  PlannedBuffer params_, grads_, master_, exp_avg_, exp_avg_sq_;
  Buffer totals_;  // two floats for the overflow flag and the squared norm
  std::vector<BucketBuffer> buckets_;
  std::vector<GatherBuffer> gathers_;  // a slot beyond the plan's may hold no memory
  int64_t gather_numel_ = 0;           // elements of one gather buffer
  plan::BufferLayout gather_layout_ = plan::BufferLayout::kFlat;
  int64_t gather_clock_ = 0;  // orders the gather buffers' uses
  int64_t gather_overflows_ = 0;
  int64_t peak_gather_buffers_ = 0;
  std::vector<SegmentState> segments_;

  // Backward bookkeeping for the current micro-step.
  std::vector<bool> grad_seen_;
  int64_t grads_this_micro_ = 0;
  int64_t micro_steps_ = 0;
  int64_t next_bucket_ = 0;  // round-robin over bucket buffers
  // Full buckets whose reduce-scatter waits to go with the next ones', in the order they filled.
  std::vector<int64_t> held_buckets_;

  // Stage 3: the direction of travel, for prefetch.
  int64_t last_gathered_ = -1;
  int direction_ = 1;

  // Per tensor: whether this rank gave it a gradient since the last ZeroGrad(set_to_none).
  std::vector<bool> has_grad_;
  // Per tensor: the steps that updated it (Adam's bias correction counts these).
  std::vector<int64_t> tensor_steps_;

  LossScaler scaler_;
  int64_t step_ = 0;                      // applied steps
  std::atomic<int64_t> steps_taken_ = 0;  // applied or skipped, for step()
  std::atomic<int64_t> wait_ns_[static_cast<int>(WaitFor::kCount)] = {};
  CollectiveLog log_;
};

}  // namespace zerod::engine

#endif  // ZEROD_RUNTIME_ENGINE_ZERO_ENGINE_H_
