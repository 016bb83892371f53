#include "runtime/engine/zero_engine.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/common/status_macros.h"

namespace zerod::engine {
using plan::MemoryCategory;

absl::StatusOr<std::unique_ptr<ZeroEngine>> ZeroEngine::Create(
    std::shared_ptr<const plan::ShardPlan> plan, comm::Communicator* comm, EngineOptions options) {
  if (plan == nullptr || comm == nullptr) {
    return absl::InvalidArgumentError("engine: a plan and a communicator are required");
  }
  if (comm->world_size() != plan->world_size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine: the plan is for ", plan->world_size(),
                     " ranks, the communicator has ", comm->world_size()));
  }
  if (options.gather_comm != nullptr && (options.gather_comm->world_size() != comm->world_size() ||
                                         options.gather_comm->rank() != comm->rank())) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: the gather communicator is rank ", options.gather_comm->rank(),
                     " of ", options.gather_comm->world_size(), ", the main one rank ",
                     comm->rank(), " of ", comm->world_size()));
  }
  if (options.accumulation_steps < 1) {
    return absl::InvalidArgumentError("engine: accumulation_steps must be at least 1");
  }
  if (plan->options().grad_dtype == DType::kFloat16) options.loss_scale.enabled = true;
  if (options.device == nullptr) {
    options.device =
        HostOps(options.threads > 1 ? std::make_shared<ThreadPool>(options.threads) : nullptr);
  }
  std::unique_ptr<ZeroEngine> engine(new ZeroEngine(std::move(plan), comm, std::move(options)));
  ZEROD_RETURN_IF_ERROR(engine->AllocateBuffers());
  return engine;
}

ZeroEngine::ZeroEngine(std::shared_ptr<const plan::ShardPlan> plan, comm::Communicator* comm,
                       EngineOptions options)
    : plan_(std::move(plan)),
      comm_(comm),
      gather_comm_(options.gather_comm != nullptr ? options.gather_comm : comm),
      exchange_(plan_->stage() == 3 ? options.shard_exchange.get() : nullptr),
      options_(std::move(options)),
      rank_(comm->rank()),
      stage_(plan_->stage()),
      scaler_(options_.loss_scale) {}

absl::Status ZeroEngine::AllocateBuffers() {
  ops_ = options_.device;
  for (const plan::Allocation& a : plan_->Allocations()) {
    const bool grads =
        a.category == MemoryCategory::kGrads || a.category == MemoryCategory::kBucketBuffers;
    const DType dtype =
        a.element_bytes == 4 ? DType::kFloat32 : (grads ? grad_dtype() : param_dtype());
    auto make = [&]() -> absl::StatusOr<PlannedBuffer> {
      ZEROD_ASSIGN_OR_RETURN(Buffer memory, Buffer::Allocate(ops_, dtype, a.numel));
      return PlannedBuffer{std::move(memory), a.layout};
    };
    if (a.category == MemoryCategory::kParams && exchange_ != nullptr) {
      // The shard every rank pulls from lives in the exchange's shared memory.
      if (exchange_->bytes() < a.numel * DTypeBytes(dtype)) {
        return absl::InvalidArgumentError(
            absl::StrCat("engine: the shard exchange holds ", exchange_->bytes(),
                         " bytes, the parameter shard needs ", a.numel * DTypeBytes(dtype)));
      }
      params_ = PlannedBuffer{Buffer::Borrow(ops_, dtype, a.numel, exchange_->own()), a.layout};
      continue;
    }
    if (PlannedBuffer* single = SingleBuffer(a.category)) {
      ZEROD_ASSIGN_OR_RETURN(*single, make());
      continue;
    }
    for (int64_t i = 0; i < a.count; ++i) {
      ZEROD_ASSIGN_OR_RETURN(PlannedBuffer b, make());
      if (a.category == MemoryCategory::kBucketBuffers) buckets_.push_back({std::move(b)});
      if (a.category == MemoryCategory::kGatherBuffers) {
        gather_numel_ = a.numel;
        gather_layout_ = a.layout;
        gathers_.push_back({std::move(b)});
      }
    }
  }
  peak_gather_buffers_ = static_cast<int64_t>(gathers_.size());
  // Step's agreement: the overflow flag, the squared norm, then a flag per tensor.
  const int64_t tensors = static_cast<int64_t>(plan_->tensors().size());
  ZEROD_ASSIGN_OR_RETURN(totals_, Buffer::Allocate(ops_, DType::kFloat32, 2 + tensors));
  grad_seen_.assign(plan_->tensors().size(), false);
  has_grad_.assign(plan_->tensors().size(), false);
  tensor_steps_.assign(plan_->tensors().size(), 0);
  segments_.resize(plan_->segments().size());
  for (size_t k = 0; k < segments_.size(); ++k) {
    segments_[k].grads_pending = plan_->segments()[k].tensor_count;
  }
  return absl::OkStatus();
}

ZeroEngine::~ZeroEngine() {
  // A pull still copying into a gather buffer must be done before the buffer goes (an all-gather
  // is, by its communicator's destruction, which comes first).
  if (exchange_ == nullptr) return;
  exchange_->Abort(absl::CancelledError("engine: destroyed"));
  for (GatherBuffer& g : gathers_) {
    if (g.gather != nullptr && g.gather->work != nullptr && !g.gather->result) {
      (void)g.gather->work->Wait(options_.collective_timeout);
    }
  }
}

ZeroEngine::PlannedBuffer* ZeroEngine::SingleBuffer(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kParams:
      return &params_;
    case MemoryCategory::kGrads:
      return &grads_;
    case MemoryCategory::kMaster:
      return &master_;
    case MemoryCategory::kAdamM:
      return &exp_avg_;
    case MemoryCategory::kAdamV:
      return &exp_avg_sq_;
    default:
      return nullptr;
  }
}

int64_t ZeroEngine::UnitOf(int64_t tensor) const {
  return plan_->placements()[static_cast<size_t>(tensor)].segment;
}

absl::Status ZeroEngine::Wait(std::shared_ptr<InFlight>& in_flight, WaitFor what) {
  if (in_flight == nullptr) return absl::OkStatus();
  const std::shared_ptr<InFlight> shared = std::move(in_flight);
  if (!shared->result) shared->result = Wait(std::move(shared->work), what);
  return *shared->result;
}

absl::Status ZeroEngine::Wait(std::unique_ptr<comm::Work> work, WaitFor what) {
  const absl::Time start = absl::Now();
  absl::Status s = work->Wait(options_.collective_timeout);
  wait_ns_[static_cast<int>(what)].fetch_add(absl::ToInt64Nanoseconds(absl::Now() - start),
                                             std::memory_order_relaxed);
  if (s.code() == absl::StatusCode::kDeadlineExceeded) GiveUp(*work, s);
  return s.ok() ? s : Explain(std::move(s));
}

void ZeroEngine::GiveUp(comm::Work& work, const absl::Status& why) {
  // A collective given up on may still hold this engine's buffers (a temporary may be freed on
  // return): aborting it tears its transport down, and its Wait returns once nothing can land.
  work.Abort(why);
  (void)work.Wait(options_.collective_timeout);
}

absl::Status ZeroEngine::Explain(absl::Status failure) {
  // A cause already known (a rank the coordinator declared lost) needs no order check, which
  // would only wait for the lost rank's sequence.
  if (options_.explain_failure) {
    absl::Status known = options_.explain_failure(failure, /*wait=*/false);
    if (known != failure) return known;
  }
  absl::Status check;
  if (options_.check_store != nullptr) {
    check = log_.Compare(*options_.check_store, absl::StrCat("failure-", log_.count()), rank_,
                         plan_->world_size(), absl::Seconds(5));
  }
  return Blame(check, failure);
}

absl::Status ZeroEngine::Blame(const absl::Status& check, const absl::Status& failure) {
  absl::Status seen = failure;
  if (!check.ok()) {
    seen = failure.ok()
               ? check
               : absl::Status(check.code(), absl::StrCat(check.message(), "; ", failure.message()));
  }
  // Sequences that differ are the cause. A rank that did not report may be dead: the coordinator
  // may still name it.
  if (check.code() == absl::StatusCode::kFailedPrecondition) return seen;
  if (options_.explain_failure) {
    const absl::Status& symptom = failure.ok() ? check : failure;
    absl::Status known = options_.explain_failure(symptom, /*wait=*/true);
    if (known != symptom) return known;
  }
  return seen;
}

absl::Status ZeroEngine::InitParameters(const std::function<void(int64_t, float*)>& init) {
  ZEROD_RETURN_IF_ERROR(DropGatheredUnits());
  ZEROD_RETURN_IF_ERROR(BeginShardWrite());
  ZEROD_RETURN_IF_ERROR(InitTensors(0, static_cast<int64_t>(plan_->tensors().size()), init));
  ZEROD_RETURN_IF_ERROR(ops_->Synchronize());
  EndShardWrite();
  return absl::OkStatus();
}

absl::Status ZeroEngine::InitTensors(int64_t first, int64_t last,
                                     const std::function<void(int64_t, float*)>& init) {
  ZEROD_RETURN_IF_ERROR(DropGatheredUnits());
  std::vector<float> full;
  std::vector<char> staged;  // values converted to a buffer's dtype, on the host
  auto upload = [&](PlannedBuffer& b, int64_t at, const float* values, int64_t n) {
    const DType dtype = b.memory.dtype();
    if (dtype == DType::kFloat32) return ops_->Upload(b.memory.at(at), values, n * 4);
    staged.resize(static_cast<size_t>(n * DTypeBytes(dtype)));
    for (int64_t i = 0; i < n; ++i) StoreAs(dtype, staged.data(), i, values[i]);
    return ops_->Upload(b.memory.at(at), staged.data(), n * DTypeBytes(dtype));
  };
  // A sharded buffer keeps this rank's pieces of tensor t, any other the whole tensor.
  auto put = [&](PlannedBuffer& b, int64_t t) -> absl::Status {
    const plan::TensorPlacement& place = plan_->placements()[static_cast<size_t>(t)];
    if (b.layout != plan::BufferLayout::kShard) {
      return upload(b, place.flat_offset, full.data(), place.numel);
    }
    for (const plan::Piece& p : plan_->Pieces(t)) {
      if (p.owner_rank != plan::kReplicated && p.owner_rank != rank_) continue;
      ZEROD_RETURN_IF_ERROR(upload(b, p.shard_offset, full.data() + p.tensor_offset, p.numel));
    }
    return absl::OkStatus();
  };
  for (int64_t t = first; t < last; ++t) {
    full.assign(static_cast<size_t>(plan_->placements()[static_cast<size_t>(t)].numel), 0.0f);
    init(t, full.data());
    ZEROD_RETURN_IF_ERROR(put(params_, t));
    if (mixed()) ZEROD_RETURN_IF_ERROR(put(master_, t));
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::Broadcast(float* values, int64_t count, int64_t root) {
  if (root < 0 || root >= plan_->world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("engine: no rank ", root, " to broadcast from (",
                                                   plan_->world_size(), " ranks)"));
  }
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("engine: broadcast of ", count));
  if (count == 0) return absl::OkStatus();
  ZEROD_ASSIGN_OR_RETURN(Buffer wire, Buffer::Allocate(ops_, DType::kFloat32, count));
  ZEROD_RETURN_IF_ERROR(ops_->Upload(wire.data(), values, wire.Bytes()));
  log_.Record("broadcast", count, DType::kFloat32);
  ZEROD_RETURN_IF_ERROR(
      Wait(comm_->Broadcast(wire.data(), count, DType::kFloat32, root), WaitFor::kOther));
  return ops_->Download(values, wire.data(), wire.Bytes());
}

absl::Status ZeroEngine::InitParametersFrom(int64_t root,
                                            const std::function<void(int64_t, float*)>& init,
                                            int64_t batch_numel) {
  // In batches of consecutive tensors of at most batch_numel elements (a larger tensor alone), so
  // the copies on the way (the host batch, the communicator's) stay small beside the model:
  // a rank that will hold 1/N of it at stage 3 must not hold all of it twice first.
  const std::vector<plan::TensorPlacement>& places = plan_->placements();
  const int64_t count = static_cast<int64_t>(places.size());
  ZEROD_RETURN_IF_ERROR(DropGatheredUnits());
  ZEROD_RETURN_IF_ERROR(BeginShardWrite());
  std::vector<float> batch;
  std::vector<int64_t> start;  // tensor first + k at start[k] of the batch
  for (int64_t first = 0; first < count;) {
    int64_t last = first;
    start.assign(1, 0);
    while (
        last < count &&
        (last == first || start.back() + places[static_cast<size_t>(last)].numel <= batch_numel)) {
      start.push_back(start.back() + places[static_cast<size_t>(last)].numel);
      ++last;
    }
    batch.assign(static_cast<size_t>(start.back()), 0.0f);
    if (rank_ == root) {
      for (int64_t t = first; t < last; ++t) {
        init(t, batch.data() + start[static_cast<size_t>(t - first)]);
      }
    }
    ZEROD_RETURN_IF_ERROR(Broadcast(batch.data(), start.back(), root));
    ZEROD_RETURN_IF_ERROR(InitTensors(first, last, [&](int64_t t, float* out) {
      std::copy(batch.begin() + start[static_cast<size_t>(t - first)],
                batch.begin() + start[static_cast<size_t>(t - first) + 1], out);
    }));
    first = last;
  }
  ZEROD_RETURN_IF_ERROR(ops_->Synchronize());
  EndShardWrite();
  return absl::OkStatus();
}

absl::StatusOr<TensorView> ZeroEngine::Param(int64_t tensor) {
  if (tensor < 0 || tensor >= static_cast<int64_t>(plan_->tensors().size())) {
    return absl::InvalidArgumentError(absl::StrCat("engine: no tensor ", tensor));
  }
  const plan::TensorPlacement& place = plan_->placements()[static_cast<size_t>(tensor)];
  if (stage_ < 3) {
    return TensorView{params_.memory.at(place.flat_offset), param_dtype(), place.numel};
  }
  const int64_t g = segments_[static_cast<size_t>(place.segment)].gather;
  // A released unit may still sit in its buffer, but only until the next gather displaces it.
  // (A prefetch nobody has asked for yet may be read, as before Release existed as a cache.)
  const bool released = g >= 0 && !gathers_[static_cast<size_t>(g)].requested &&
                        gathers_[static_cast<size_t>(g)].last_use > 0;
  if (g < 0 || released) {
    return absl::FailedPreconditionError(absl::StrCat(
        "engine: tensor '", plan_->tensors()[static_cast<size_t>(tensor)].name, "' (unit ",
        place.segment, ") used before Gather(", place.segment, ") or after its Release"));
  }
  ZEROD_RETURN_IF_ERROR(WaitGather(g));
  return TensorView{gathers_[static_cast<size_t>(g)].buffer.memory.at(place.segment_offset),
                    param_dtype(), place.numel};
}

absl::Status ZeroEngine::ParamToFloat(int64_t tensor, float* out) {
  ZEROD_ASSIGN_OR_RETURN(TensorView view, Param(tensor));
  if (!ops_->on_device()) {
    for (int64_t i = 0; i < view.numel; ++i) out[i] = LoadAs(view.dtype, view.data, i);
    return absl::OkStatus();
  }
  std::vector<char> host(static_cast<size_t>(view.numel * DTypeBytes(view.dtype)));
  ZEROD_RETURN_IF_ERROR(ops_->Download(host.data(), view.data, static_cast<int64_t>(host.size())));
  for (int64_t i = 0; i < view.numel; ++i) out[i] = LoadAs(view.dtype, host.data(), i);
  return absl::OkStatus();
}

absl::Status ZeroEngine::FinishReduceScatter(BucketBuffer& bucket) {
  if (bucket.reduce == nullptr) return absl::OkStatus();
  ZEROD_RETURN_IF_ERROR(Wait(bucket.reduce, WaitFor::kReduce));
  const plan::OwnedRange mine = plan_->SliceOf(rank_, bucket.segment);
  ZEROD_RETURN_IF_ERROR(
      ops_->AddSame(grad_dtype(), grads_.Slice(mine), bucket.buffer.Slice(mine), mine.numel));
  ZEROD_RETURN_IF_ERROR(bucket.buffer.memory.Zero(
      0, plan_->segments()[static_cast<size_t>(bucket.segment)].padded_numel));
  bucket.segment = -1;
  return absl::OkStatus();
}

absl::StatusOr<ZeroEngine::BucketBuffer*> ZeroEngine::BucketFor(int64_t segment) {
  SegmentState& state = segments_[static_cast<size_t>(segment)];
  if (state.bucket >= 0) return &buckets_[static_cast<size_t>(state.bucket)];
  // Round-robin over the bucket buffers; reusing one waits for its reduce-scatter. A buffer that
  // another segment is still filling is passed over: reusing it would mix the two segments.
  const int64_t n = static_cast<int64_t>(buckets_.size());
  for (int64_t tried = 0; tried < n; ++tried) {
    const int64_t b = next_bucket_;
    next_bucket_ = (next_bucket_ + 1) % n;
    BucketBuffer& bucket = buckets_[static_cast<size_t>(b)];
    if (bucket.segment >= 0 && bucket.reduce == nullptr) continue;
    ZEROD_RETURN_IF_ERROR(FinishReduceScatter(bucket));
    bucket.segment = segment;
    state.bucket = b;
    return &bucket;
  }
  // Full buckets held back for a group (HoldReduce) can be sent and waited for: gradients given
  // out of order may open more segments than HoldReduce left a buffer for.
  if (!held_buckets_.empty()) {
    LaunchHeldReduces();
    return BucketFor(segment);
  }
  std::vector<int64_t> filling;
  for (const BucketBuffer& bucket : buckets_) filling.push_back(bucket.segment);
  return absl::FailedPreconditionError(absl::StrCat(
      "engine: a gradient of segment ", segment, " arrived while all ", n,
      " bucket buffers (plan bucket_buffers) are still filling segments ",
      absl::StrJoin(filling, ", "), "; give each segment's gradients together, last tensor first"));
}

bool ZeroEngine::HoldReduce() const {
  // The micro-step's last gradient (counted after this call) sends everything.
  if (grads_this_micro_ + 1 == static_cast<int64_t>(plan_->tensors().size())) return false;
  int64_t held_bytes = 0;
  for (int64_t b : held_buckets_) {
    held_bytes += SegmentBytes(buckets_[static_cast<size_t>(b)].segment, grad_dtype());
  }
  if (held_bytes >= kCoalesceBytes) return false;
  // The next segment needs a bucket buffer that is free or whose reduce-scatter it can wait for.
  return std::any_of(buckets_.begin(), buckets_.end(), [](const BucketBuffer& bucket) {
    return bucket.segment < 0 || bucket.reduce != nullptr;
  });
}

void ZeroEngine::LaunchHeldReduces() {
  if (held_buckets_.empty()) return;
  const auto in_flight = std::make_shared<InFlight>();
  std::vector<comm::ChunkedBuffer> parts;
  for (int64_t b : held_buckets_) {
    BucketBuffer& bucket = buckets_[static_cast<size_t>(b)];
    const int64_t slice_numel = plan_->segments()[static_cast<size_t>(bucket.segment)].slice_numel;
    log_.Record("reduce_scatter", slice_numel, grad_dtype());
    parts.push_back({bucket.buffer.memory.data(), slice_numel});
    bucket.reduce = in_flight;
  }
  held_buckets_.clear();
  in_flight->work = comm_->ReduceScatterGroup(parts, grad_dtype());
  in_flight->work->Start();  // overlaps the rest of the backward pass
}

absl::Status ZeroEngine::AccumulateGrad(int64_t tensor, const float* grad) {
  if (tensor < 0 || tensor >= static_cast<int64_t>(plan_->tensors().size())) {
    return absl::InvalidArgumentError(absl::StrCat("engine: no tensor ", tensor));
  }
  if (grad_seen_[static_cast<size_t>(tensor)]) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine: gradient of '", plan_->tensors()[static_cast<size_t>(tensor)].name,
                     "' given twice in one micro-step"));
  }
  grad_seen_[static_cast<size_t>(tensor)] = true;
  if (grad != nullptr) has_grad_[static_cast<size_t>(tensor)] = true;
  const plan::TensorPlacement& place = plan_->placements()[static_cast<size_t>(tensor)];
  if (stage_ < 2) {
    if (grad != nullptr) {
      ZEROD_RETURN_IF_ERROR(
          ops_->AddFloat(grad_dtype(), grads_.memory.at(place.flat_offset), grad, place.numel));
    }
  } else {
    ZEROD_ASSIGN_OR_RETURN(BucketBuffer * bucket, BucketFor(place.segment));
    if (grad != nullptr) {
      ZEROD_RETURN_IF_ERROR(ops_->AddFloat(
          grad_dtype(), bucket->buffer.memory.at(place.segment_offset), grad, place.numel));
    }
    SegmentState& state = segments_[static_cast<size_t>(place.segment)];
    if (--state.grads_pending == 0) {
      // The bucket is full: reduce-scatter it while backward continues, or with the next ones.
      held_buckets_.push_back(state.bucket);
      state.bucket = -1;
      if (!HoldReduce()) LaunchHeldReduces();
    }
  }
  if (++grads_this_micro_ == static_cast<int64_t>(plan_->tensors().size())) {
    ++micro_steps_;
    grads_this_micro_ = 0;
    std::fill(grad_seen_.begin(), grad_seen_.end(), false);
    for (size_t k = 0; k < segments_.size(); ++k) {
      segments_[k].grads_pending = plan_->segments()[k].tensor_count;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> ZeroEngine::Step(std::optional<double> lr) {
  ParamGroups one{{options_.adam}, std::vector<int32_t>(plan_->tensors().size(), 0)};
  if (lr) one.configs[0].lr = *lr;
  return Step(one);
}

plan::MemoryBreakdown ZeroEngine::MemoryByCategory() const {
  plan::MemoryBreakdown m;
  const int64_t owned = plan_->OwnedRealNumel(rank_);
  const int64_t total = plan_->total_numel();
  auto model_state = [&](MemoryCategory c, const PlannedBuffer& b) {
    if (b.memory.numel() == 0) return;
    const int64_t real =
        (b.layout == plan::BufferLayout::kShard ? owned : total) * DTypeBytes(b.memory.dtype());
    m[c] += real;
    m[MemoryCategory::kPadding] += b.memory.Bytes() - real;
  };
  model_state(MemoryCategory::kParams, params_);
  model_state(MemoryCategory::kGrads, grads_);
  model_state(MemoryCategory::kMaster, master_);
  model_state(MemoryCategory::kAdamM, exp_avg_);
  model_state(MemoryCategory::kAdamV, exp_avg_sq_);
  for (const BucketBuffer& b : buckets_)
    m[MemoryCategory::kBucketBuffers] += b.buffer.memory.Bytes();
  for (const GatherBuffer& g : gathers_)
    m[MemoryCategory::kGatherBuffers] += g.buffer.memory.Bytes();
  return m;
}

std::map<std::string, int64_t> ZeroEngine::BytesSent() const {
  std::map<std::string, int64_t> sent = comm_->BytesSent();
  if (gather_comm_ != comm_) {
    for (const auto& [name, bytes] : gather_comm_->BytesSent()) sent[name] += bytes;
  }
  return sent;
}

std::map<std::string, double> ZeroEngine::CollectiveWaitSeconds() const {
  auto seconds = [this](WaitFor what) {
    return static_cast<double>(wait_ns_[static_cast<int>(what)].load(std::memory_order_relaxed)) /
           1e9;
  };
  return {{"gather", seconds(WaitFor::kGather)},
          {"reduce", seconds(WaitFor::kReduce)},
          {"update", seconds(WaitFor::kUpdate)},
          {"other", seconds(WaitFor::kOther)}};
}

int64_t ZeroEngine::AllocatedBytes() const {
  int64_t total = 0;
  for (const PlannedBuffer* b : {&params_, &grads_, &master_, &exp_avg_, &exp_avg_sq_}) {
    total += b->memory.Bytes();
  }
  for (const BucketBuffer& b : buckets_) total += b.buffer.memory.Bytes();
  for (const GatherBuffer& g : gathers_) total += g.buffer.memory.Bytes();
  return total;
}

absl::StatusOr<double> ZeroEngine::Average(double value) {
  // Through totals_, the engine's small fp32 scratch (Step's overflow flag and norm), so a loss
  // logged every step allocates nothing.
  float sum = static_cast<float>(value);
  ZEROD_RETURN_IF_ERROR(ops_->Upload(totals_.data(), &sum, sizeof(float)));
  log_.Record("all_reduce", 1, DType::kFloat32);
  ZEROD_RETURN_IF_ERROR(Wait(comm_->AllReduce(totals_.f32(), 1, DType::kFloat32), WaitFor::kOther));
  ZEROD_RETURN_IF_ERROR(ops_->Download(&sum, totals_.f32(), sizeof(float)));
  return static_cast<double>(sum) / static_cast<double>(plan_->world_size());
}

absl::StatusOr<std::vector<float>> ZeroEngine::FullMasterParameters() {
  ZEROD_ASSIGN_OR_RETURN(Buffer memory,
                         Buffer::Allocate(ops_, DType::kFloat32, plan_->padded_numel()));
  PlannedBuffer full{std::move(memory), plan::BufferLayout::kFlat};
  PlannedBuffer& master = Master();
  for (const plan::OwnedRange& r : plan_->OwnedRanges(rank_)) {
    ZEROD_RETURN_IF_ERROR(ops_->Copy(full.Slice(r), master.Slice(r), r.numel * 4));
  }
  if (stage_ > 0) {
    ZEROD_RETURN_IF_ERROR(Wait(
        comm_->AllGatherGroup(SegmentsOf(full, "all_gather", DType::kFloat32), DType::kFloat32),
        WaitFor::kOther));
  }
  std::vector<float> host(static_cast<size_t>(plan_->padded_numel()));
  ZEROD_RETURN_IF_ERROR(ops_->Download(host.data(), full.memory.data(), full.memory.Bytes()));
  std::vector<float> out;
  out.reserve(static_cast<size_t>(plan_->total_numel()));
  for (const plan::TensorPlacement& place : plan_->placements()) {
    out.insert(out.end(), host.begin() + place.flat_offset,
               host.begin() + place.flat_offset + place.numel);
  }
  return out;
}

}  // namespace zerod::engine

namespace zerod::engine {

absl::Status ZeroEngine::GatherParameters() {
  if (stage_ != 1 && stage_ != 2) return absl::OkStatus();
  return Wait(
      comm_->AllGatherGroup(SegmentsOf(params_, "all_gather", param_dtype()), param_dtype()),
      WaitFor::kUpdate);
}

std::vector<comm::ChunkedBuffer> ZeroEngine::SegmentsOf(PlannedBuffer& flat, const char* collective,
                                                        DType dtype) {
  std::vector<comm::ChunkedBuffer> buffers;
  for (const plan::Segment& seg : plan_->segments()) {
    log_.Record(collective, seg.slice_numel, dtype);
    buffers.push_back({flat.memory.at(seg.flat_offset), seg.slice_numel});
  }
  return buffers;
}

ZeroEngine::PlannedBuffer& ZeroEngine::State(StateTensor which) {
  switch (which) {
    case StateTensor::kAdamM:
      return exp_avg_;
    case StateTensor::kAdamV:
      return exp_avg_sq_;
    case StateTensor::kMaster:
      break;
  }
  return Master();
}

std::vector<ZeroEngine::HeldPiece> ZeroEngine::HeldPieces() const {
  std::vector<HeldPiece> pieces;
  int64_t segment_model_offset = 0;  // segments hold consecutive tensors, unpadded in between
  for (size_t s = 0; s < plan_->segments().size(); ++s) {
    const plan::OwnedRange slice = plan_->SliceOf(rank_, static_cast<int64_t>(s));
    if (slice.real_numel > 0) {
      pieces.push_back({segment_model_offset + slice.segment_offset, slice.real_numel, slice});
    }
    segment_model_offset += plan_->segments()[s].numel;
  }
  return pieces;
}

std::vector<ModelRun> ZeroEngine::HeldRuns() const {
  std::vector<ModelRun> runs;
  for (const HeldPiece& p : HeldPieces()) {
    if (!runs.empty() && runs.back().offset + runs.back().numel == p.model_offset) {
      runs.back().numel += p.numel;
    } else {
      runs.push_back({p.model_offset, p.numel});
    }
  }
  return runs;
}

std::vector<ModelRun> ZeroEngine::SavedRuns() const {
  if (stage_ > 0) return HeldRuns();
  const int64_t total = plan_->total_numel();
  const int64_t world = plan_->world_size();
  const int64_t share = (total + world - 1) / world;
  const int64_t first = std::min(total, rank_ * share);
  const int64_t last = std::min(total, first + share);
  if (last == first) return {};
  return {ModelRun{first, last - first}};
}

TrainingCounters ZeroEngine::counters() const {
  return {step_, steps_taken_.load(std::memory_order_relaxed), scaler_.state(), tensor_steps_};
}

absl::Status ZeroEngine::ForEachHeld(
    const ModelRun& run,
    const std::function<absl::Status(const HeldPiece&, int64_t, int64_t, int64_t)>& fn) const {
  if (run.offset < 0 || run.numel < 0 || run.numel > plan_->total_numel() - run.offset) {
    return absl::InvalidArgumentError(absl::StrCat("engine: model elements [", run.offset, ", +",
                                                   run.numel, ") are outside the model's ",
                                                   plan_->total_numel()));
  }
  int64_t at = run.offset;
  const int64_t end = run.offset + run.numel;
  for (const HeldPiece& p : HeldPieces()) {
    if (at == end) break;
    if (p.model_offset + p.numel <= at) continue;
    if (p.model_offset > at) break;
    const int64_t n = std::min(end, p.model_offset + p.numel) - at;
    ZEROD_RETURN_IF_ERROR(fn(p, at - p.model_offset, at - run.offset, n));
    at += n;
  }
  if (at != end) {
    return absl::InvalidArgumentError(absl::StrCat("engine: model element ", at,
                                                   " is not held by rank ", rank_, " (stage ",
                                                   stage_, ", ", plan_->world_size(), " ranks)"));
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::ReadState(StateTensor which, const ModelRun& run, float* out) {
  PlannedBuffer& buffer = State(which);
  return ForEachHeld(run, [&](const HeldPiece& p, int64_t in_piece, int64_t in_run, int64_t n) {
    return ops_->Download(out + in_run, buffer.F32Slice(p.slice) + in_piece, n * 4);
  });
}

absl::Status ZeroEngine::WriteState(StateTensor which, const ModelRun& run, const float* values) {
  PlannedBuffer& buffer = State(which);
  return ForEachHeld(run, [&](const HeldPiece& p, int64_t in_piece, int64_t in_run, int64_t n) {
    return ops_->Upload(buffer.F32Slice(p.slice) + in_piece, values + in_run, n * 4);
  });
}

absl::Status ZeroEngine::FinishRestore(const TrainingCounters& counters) {
  if (micro_steps_ != 0 || grads_this_micro_ != 0) {
    return absl::FailedPreconditionError(
        "engine: a restore in the middle of a step (after backward, before Step)");
  }
  const size_t tensors = plan_->tensors().size();
  if (!counters.tensor_steps.empty() && counters.tensor_steps.size() != tensors) {
    return absl::InvalidArgumentError(absl::StrCat("engine: step counts of ",
                                                   counters.tensor_steps.size(),
                                                   " tensors restored into a model of ", tensors));
  }
  for (int64_t steps : counters.tensor_steps) {
    if (steps < 0 || steps > counters.applied_steps) {
      return absl::InvalidArgumentError(absl::StrCat("engine: a tensor step count of ", steps,
                                                     " is outside [0, ", counters.applied_steps,
                                                     "] (the applied steps)"));
    }
  }
  ZEROD_RETURN_IF_ERROR(DropGatheredUnits());
  // The master copy was written already (WriteState), which in fp32 is the shard others pull
  // from: safe, since every rank agreed to load before any wrote (LoadCheckpoint), so no rank
  // was gathering. The phase tells them the new values are there.
  ZEROD_RETURN_IF_ERROR(BeginShardWrite());
  if (mixed()) {
    // The low-precision parameters are the master copy rounded, as Adam writes them.
    std::vector<float> master;
    std::vector<char> low;
    const DType dtype = param_dtype();
    for (const HeldPiece& p : HeldPieces()) {
      master.resize(static_cast<size_t>(p.numel));
      low.resize(static_cast<size_t>(p.numel * DTypeBytes(dtype)));
      ZEROD_RETURN_IF_ERROR(ops_->Download(master.data(), master_.Slice(p.slice), p.numel * 4));
      // One loop per dtype, not a switch per element: the compiler vectorises these.
      uint16_t* out = reinterpret_cast<uint16_t*>(low.data());
      if (dtype == DType::kBFloat16) {
        for (int64_t i = 0; i < p.numel; ++i) out[i] = FloatToBf16(master[i]);
      } else {
        for (int64_t i = 0; i < p.numel; ++i) out[i] = FloatToFp16(master[i]);
      }
      ZEROD_RETURN_IF_ERROR(
          ops_->Upload(params_.Slice(p.slice), low.data(), p.numel * DTypeBytes(dtype)));
    }
  }
  ZEROD_RETURN_IF_ERROR(GatherParameters());
  ZEROD_RETURN_IF_ERROR(grads_.memory.Zero(0, grads_.memory.numel()));
  ZEROD_RETURN_IF_ERROR(ops_->Synchronize());
  EndShardWrite();
  step_ = counters.applied_steps;
  steps_taken_.store(counters.steps_taken, std::memory_order_relaxed);
  scaler_.set_state(counters.loss_scaler);
  if (counters.tensor_steps.empty()) {
    tensor_steps_.assign(tensors, counters.applied_steps);
  } else {
    tensor_steps_ = counters.tensor_steps;
  }
  return absl::OkStatus();
}

}  // namespace zerod::engine
