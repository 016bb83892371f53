#include "runtime/engine/zero_engine.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace zerod::engine {
namespace {

using plan::MemoryCategory;

}  // namespace

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
    auto make = [&]() { return Buffer::Allocate(ops_, dtype, a.numel); };
    if (a.name == "params") {
      ZEROD_ASSIGN_OR_RETURN(params_, make());
    }
    if (a.name == "grads") {
      ZEROD_ASSIGN_OR_RETURN(grads_, make());
    }
    if (a.name == "master") {
      ZEROD_ASSIGN_OR_RETURN(master_, make());
    }
    if (a.name == "adam_m") {
      ZEROD_ASSIGN_OR_RETURN(exp_avg_, make());
    }
    if (a.name == "adam_v") {
      ZEROD_ASSIGN_OR_RETURN(exp_avg_sq_, make());
    }
    for (int64_t i = 0; a.name == "bucket" && i < a.count; ++i) {
      ZEROD_ASSIGN_OR_RETURN(Buffer b, make());
      buckets_.push_back(std::move(b));
    }
    for (int64_t i = 0; a.name == "gather" && i < a.count; ++i) {
      ZEROD_ASSIGN_OR_RETURN(Buffer b, make());
      gathers_.push_back(std::move(b));
    }
  }
  ZEROD_ASSIGN_OR_RETURN(totals_, Buffer::Allocate(ops_, DType::kFloat32, 2));
  const size_t tensors = plan_->tensors().size();
  const size_t segments = plan_->segments().size();
  grad_seen_.assign(tensors, false);
  segment_pending_.assign(segments, 0);
  for (size_t k = 0; k < segments; ++k) segment_pending_[k] = plan_->segments()[k].tensor_count;
  segment_bucket_.assign(segments, -1);
  bucket_flight_.resize(buckets_.size());
  unit_slot_.assign(segments, -1);
  slot_work_.resize(gathers_.size());
  slot_unit_.assign(gathers_.size(), -1);
  return absl::OkStatus();
}

ZeroEngine::~ZeroEngine() = default;

float* ZeroEngine::Master() { return mixed() ? master_.f32() : params_.f32(); }

int64_t ZeroEngine::UnitOf(int64_t tensor) const {
  return plan_->placements()[static_cast<size_t>(tensor)].segment;
}

absl::Status ZeroEngine::Wait(std::unique_ptr<comm::Work> work) {
  absl::Status s = work->Wait(options_.collective_timeout);
  if (s.ok() || options_.check_store == nullptr) return s;
  // Name the culprit if the ranks' collective sequences disagree.
  absl::Status check = log_.Compare(*options_.check_store, absl::StrCat("failure-", log_.count()),
                                    rank_, plan_->world_size(), absl::Seconds(5));
  if (!check.ok())
    return absl::Status(check.code(), absl::StrCat(check.message(), "; ", s.message()));
  return s;
}

absl::Status ZeroEngine::InitParameters(const std::function<void(int64_t, float*)>& init) {
  std::vector<float> full;
  std::vector<char> staged;  // values converted to the parameter dtype, on the host
  const int64_t pb = DTypeBytes(param_dtype());
  auto upload_params = [&](int64_t at, const float* values, int64_t n) -> absl::Status {
    staged.resize(static_cast<size_t>(n * pb));
    for (int64_t i = 0; i < n; ++i) StoreAs(param_dtype(), staged.data(), i, values[i]);
    return ops_->Upload(params_.at(at), staged.data(), n * pb);
  };
  for (int64_t t = 0; t < static_cast<int64_t>(plan_->tensors().size()); ++t) {
    const plan::TensorPlacement& place = plan_->placements()[static_cast<size_t>(t)];
    full.assign(static_cast<size_t>(place.numel), 0.0f);
    init(t, full.data());
    for (const plan::Piece& p : plan_->Pieces(t)) {
      if (p.owner_rank != plan::kReplicated && p.owner_rank != rank_) continue;
      const float* values = full.data() + p.tensor_offset;
      if (mixed()) {
        ZEROD_RETURN_IF_ERROR(ops_->Upload(master_.f32() + p.shard_offset, values, p.numel * 4));
      }
      if (stage_ == 3) ZEROD_RETURN_IF_ERROR(upload_params(p.shard_offset, values, p.numel));
    }
    if (stage_ < 3)
      ZEROD_RETURN_IF_ERROR(upload_params(place.flat_offset, full.data(), place.numel));
  }
  return ops_->Synchronize();
}

absl::Status ZeroEngine::LaunchGather(int64_t unit, int64_t slot) {
  const plan::Segment& seg = plan_->segments()[static_cast<size_t>(unit)];
  Buffer& buffer = gathers_[static_cast<size_t>(slot)];
  ZEROD_RETURN_IF_ERROR(ops_->Copy(buffer.at(rank_ * seg.slice_numel), params_.at(seg.shard_offset),
                                   seg.slice_numel * DTypeBytes(param_dtype())));
  log_.Record("all_gather", seg.slice_numel, param_dtype());
  slot_work_[static_cast<size_t>(slot)] =
      gather_comm_->AllGather(buffer.data(), seg.slice_numel, param_dtype());
  slot_unit_[static_cast<size_t>(slot)] = unit;
  unit_slot_[static_cast<size_t>(unit)] = slot;
  return absl::OkStatus();
}

absl::Status ZeroEngine::Gather(int64_t unit) {
  if (unit < 0 || unit >= num_units()) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: no gather unit ", unit, " (plan has ", num_units(), ")"));
  }
  if (stage_ < 3) return absl::OkStatus();
  if (last_gathered_ >= 0 && unit != last_gathered_) direction_ = unit > last_gathered_ ? 1 : -1;
  last_gathered_ = unit;
  if (unit_slot_[static_cast<size_t>(unit)] < 0) {
    const auto free = std::find(slot_unit_.begin(), slot_unit_.end(), -1);
    if (free == slot_unit_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("engine: cannot gather unit ", unit, ": all ", gathers_.size(),
                       " gather buffers hold units (plan max_live_units); Release one first"));
    }
    ZEROD_RETURN_IF_ERROR(LaunchGather(unit, free - slot_unit_.begin()));
  }
  const int64_t slot = unit_slot_[static_cast<size_t>(unit)];
  if (slot_work_[static_cast<size_t>(slot)]) {
    ZEROD_RETURN_IF_ERROR(Wait(std::move(slot_work_[static_cast<size_t>(slot)])));
  }
  // Prefetch the next unit in the direction of travel while this one is in use.
  const int64_t next = unit + direction_;
  if (plan_->options().prefetch_depth > 0 && next >= 0 && next < num_units() &&
      unit_slot_[static_cast<size_t>(next)] < 0) {
    const auto free = std::find(slot_unit_.begin(), slot_unit_.end(), -1);
    if (free != slot_unit_.end())
      ZEROD_RETURN_IF_ERROR(LaunchGather(next, free - slot_unit_.begin()));
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::Release(int64_t unit) {
  if (stage_ < 3) return absl::OkStatus();
  if (unit < 0 || unit >= num_units() || unit_slot_[static_cast<size_t>(unit)] < 0) {
    return absl::FailedPreconditionError(absl::StrCat("engine: unit ", unit, " is not gathered"));
  }
  const int64_t slot = unit_slot_[static_cast<size_t>(unit)];
  if (slot_work_[static_cast<size_t>(slot)]) {
    ZEROD_RETURN_IF_ERROR(Wait(std::move(slot_work_[static_cast<size_t>(slot)])));
  }
  slot_unit_[static_cast<size_t>(slot)] = -1;
  unit_slot_[static_cast<size_t>(unit)] = -1;
  return absl::OkStatus();
}

absl::StatusOr<TensorView> ZeroEngine::Param(int64_t tensor) {
  if (tensor < 0 || tensor >= static_cast<int64_t>(plan_->tensors().size())) {
    return absl::InvalidArgumentError(absl::StrCat("engine: no tensor ", tensor));
  }
  const plan::TensorPlacement& place = plan_->placements()[static_cast<size_t>(tensor)];
  if (stage_ < 3) return TensorView{params_.at(place.flat_offset), param_dtype(), place.numel};
  const int64_t slot = unit_slot_[static_cast<size_t>(place.segment)];
  if (slot < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine: tensor '", plan_->tensors()[static_cast<size_t>(tensor)].name,
                     "' (unit ", place.segment, ") used before Gather(", place.segment, ")"));
  }
  if (slot_work_[static_cast<size_t>(slot)]) {
    ZEROD_RETURN_IF_ERROR(Wait(std::move(slot_work_[static_cast<size_t>(slot)])));
  }
  const plan::Segment& seg = plan_->segments()[static_cast<size_t>(place.segment)];
  return TensorView{gathers_[static_cast<size_t>(slot)].at(place.flat_offset - seg.flat_offset),
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

absl::Status ZeroEngine::WaitReduceScatter(int64_t slot) {
  InFlightBucket& flight = bucket_flight_[static_cast<size_t>(slot)];
  if (flight.segment < 0) return absl::OkStatus();
  ZEROD_RETURN_IF_ERROR(Wait(std::move(flight.work)));
  const plan::Segment& seg = plan_->segments()[static_cast<size_t>(flight.segment)];
  Buffer& bucket = buckets_[static_cast<size_t>(slot)];
  ZEROD_RETURN_IF_ERROR(ops_->AddSame(grad_dtype(), grads_.at(seg.shard_offset),
                                      bucket.at(rank_ * seg.slice_numel), seg.slice_numel));
  ZEROD_RETURN_IF_ERROR(bucket.Zero(0, seg.padded_numel));
  flight.segment = -1;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ZeroEngine::BucketSlotFor(int64_t segment) {
  int64_t& slot = segment_bucket_[static_cast<size_t>(segment)];
  if (slot >= 0) return slot;
  // Round-robin over the bucket buffers; reusing one waits for its reduce-scatter.
  const int64_t candidate = next_bucket_;
  next_bucket_ = (next_bucket_ + 1) % static_cast<int64_t>(buckets_.size());
  ZEROD_RETURN_IF_ERROR(WaitReduceScatter(candidate));
  for (int64_t& s : segment_bucket_) {
    if (s == candidate) s = -1;
  }
  slot = candidate;
  return slot;
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
  const plan::TensorPlacement& place = plan_->placements()[static_cast<size_t>(tensor)];
  const plan::Segment& seg = plan_->segments()[static_cast<size_t>(place.segment)];
  if (stage_ < 2) {
    ZEROD_RETURN_IF_ERROR(
        ops_->AddFloat(grad_dtype(), grads_.at(place.flat_offset), grad, place.numel));
  } else {
    ZEROD_ASSIGN_OR_RETURN(int64_t slot, BucketSlotFor(place.segment));
    Buffer& bucket = buckets_[static_cast<size_t>(slot)];
    ZEROD_RETURN_IF_ERROR(ops_->AddFloat(
        grad_dtype(), bucket.at(place.flat_offset - seg.flat_offset), grad, place.numel));
    if (--segment_pending_[static_cast<size_t>(place.segment)] == 0) {
      // The bucket is full: reduce-scatter it while backward continues.
      log_.Record("reduce_scatter", seg.slice_numel, grad_dtype());
      bucket_flight_[static_cast<size_t>(slot)] = {
          place.segment, comm_->ReduceScatter(bucket.data(), seg.slice_numel, grad_dtype())};
      segment_bucket_[static_cast<size_t>(place.segment)] = -1;
    }
  }
  if (++grads_this_micro_ == static_cast<int64_t>(plan_->tensors().size())) {
    ++micro_steps_;
    grads_this_micro_ = 0;
    std::fill(grad_seen_.begin(), grad_seen_.end(), false);
    for (size_t k = 0; k < segment_pending_.size(); ++k) {
      segment_pending_[k] = plan_->segments()[k].tensor_count;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> ZeroEngine::Step(std::optional<double> lr) {
  if (micro_steps_ != options_.accumulation_steps || grads_this_micro_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "engine: Step after ", micro_steps_, " complete micro-steps (and ", grads_this_micro_,
        " gradients of the next); expected ", options_.accumulation_steps));
  }
  const DType gd = grad_dtype();
  // 1. Finish the reductions.
  if (stage_ >= 2) {
    for (int64_t s = 0; s < static_cast<int64_t>(buckets_.size()); ++s) {
      ZEROD_RETURN_IF_ERROR(WaitReduceScatter(s));
    }
  } else if (stage_ == 0) {
    log_.Record("all_reduce", grads_.numel(), gd);
    ZEROD_RETURN_IF_ERROR(Wait(comm_->AllReduce(grads_.data(), grads_.numel(), gd)));
  } else {
    for (const plan::Segment& seg : plan_->segments()) {
      log_.Record("reduce_scatter", seg.slice_numel, gd);
      ZEROD_RETURN_IF_ERROR(
          Wait(comm_->ReduceScatter(grads_.at(seg.flat_offset), seg.slice_numel, gd)));
    }
  }
  const std::vector<plan::OwnedRange> ranges = plan_->OwnedRanges(rank_);
  auto grad_of = [&](const plan::OwnedRange& r) {
    return stage_ >= 2 ? grads_.at(r.shard_offset) : grads_.at(r.flat_offset);
  };
  // 2. Overflow and the global norm, from this rank's reduced gradients.
  const double scale = scaler_.scale();
  const double mean = 1.0 / (scale * static_cast<double>(plan_->world_size()) *
                             static_cast<double>(options_.accumulation_steps));
  StepResult result;
  result.loss_scale = scale;
  double coefficient = 1.0;
  if (options_.loss_scale.enabled || options_.max_grad_norm > 0) {
    double sum_squares = 0;
    bool overflow = false;
    for (const plan::OwnedRange& r : ranges) {
      ZEROD_RETURN_IF_ERROR(
          ops_->SumSquares(gd, grad_of(r), r.real_numel, &sum_squares, &overflow));
    }
    float totals[2] = {overflow ? 1.0f : 0.0f, static_cast<float>(sum_squares)};
    if (stage_ > 0) {
      // The sum goes through the communicator's memory (the GPU with NCCL).
      ZEROD_RETURN_IF_ERROR(ops_->Upload(totals_.data(), totals, sizeof(totals)));
      log_.Record("all_reduce", 2, DType::kFloat32);
      ZEROD_RETURN_IF_ERROR(Wait(comm_->AllReduce(totals_.data(), 2, DType::kFloat32)));
      ZEROD_RETURN_IF_ERROR(ops_->Download(totals, totals_.data(), sizeof(totals)));
    }
    overflow = totals[0] > 0 || !std::isfinite(totals[1]);
    result.grad_norm = std::sqrt(static_cast<double>(totals[1])) * mean;
    if (!scaler_.Update(overflow)) {
      // Skipped on every rank: they all saw the same totals.
      ZEROD_RETURN_IF_ERROR(grads_.Zero(0, grads_.numel()));
      micro_steps_ = 0;
      result.applied = false;
      return result;
    }
    if (options_.max_grad_norm > 0 && result.grad_norm > 0) {
      coefficient = std::min(1.0, options_.max_grad_norm / (result.grad_norm + 1e-6));
    }
  }
  // 3. Adam on the owned shard.
  optim::AdamConfig config = options_.adam;
  if (lr) config.lr = *lr;
  ++step_;
  const optim::AdamScalars k =
      optim::MakeAdamScalars(config, step_, static_cast<float>(mean * coefficient));
  std::vector<optim::AdamShard> shards;
  for (const plan::OwnedRange& r : ranges) {
    optim::AdamShard shard;
    shard.param = mixed() ? master_.f32() + r.shard_offset
                          : params_.f32() + (stage_ == 3 ? r.shard_offset : r.flat_offset);
    shard.exp_avg = exp_avg_.f32() + r.shard_offset;
    shard.exp_avg_sq = exp_avg_sq_.f32() + r.shard_offset;
    shard.grad = grad_of(r);
    shard.grad_dtype = gd;
    if (mixed()) {
      shard.low_precision = stage_ == 3 ? params_.at(r.shard_offset) : params_.at(r.flat_offset);
      shard.low_precision_dtype = param_dtype();
    }
    shard.numel = r.numel;
    shards.push_back(shard);
  }
  ZEROD_RETURN_IF_ERROR(ops_->Adam(shards, k));
  // 4. Every rank gets the new parameters (stages 1-2).
  if (stage_ == 1 || stage_ == 2) {
    for (const plan::Segment& seg : plan_->segments()) {
      log_.Record("all_gather", seg.slice_numel, param_dtype());
      ZEROD_RETURN_IF_ERROR(
          Wait(comm_->AllGather(params_.at(seg.flat_offset), seg.slice_numel, param_dtype())));
    }
  }
  ZEROD_RETURN_IF_ERROR(grads_.Zero(0, grads_.numel()));
  ZEROD_RETURN_IF_ERROR(ops_->Synchronize());
  micro_steps_ = 0;
  result.applied = true;
  if (options_.check_store && options_.check_every > 0 && step_ % options_.check_every == 0) {
    ZEROD_RETURN_IF_ERROR(log_.Compare(*options_.check_store, absl::StrCat("step-", step_), rank_,
                                       plan_->world_size(), options_.collective_timeout));
  }
  return result;
}

plan::MemoryBreakdown ZeroEngine::MemoryByCategory() const {
  plan::MemoryBreakdown m;
  const int64_t owned = plan_->OwnedRealNumel(rank_);
  const int64_t total = plan_->total_numel();
  auto model_state = [&](MemoryCategory c, const Buffer& b, bool sharded) {
    if (b.numel() == 0) return;
    const int64_t real = (sharded ? owned : total) * DTypeBytes(b.dtype());
    m[c] += real;
    m[MemoryCategory::kPadding] += b.Bytes() - real;
  };
  model_state(MemoryCategory::kParams, params_, stage_ == 3);
  model_state(MemoryCategory::kGrads, grads_, stage_ >= 2);
  model_state(MemoryCategory::kMaster, master_, stage_ >= 1);
  model_state(MemoryCategory::kAdamM, exp_avg_, stage_ >= 1);
  model_state(MemoryCategory::kAdamV, exp_avg_sq_, stage_ >= 1);
  for (const Buffer& b : buckets_) m[MemoryCategory::kBucketBuffers] += b.Bytes();
  for (const Buffer& b : gathers_) m[MemoryCategory::kGatherBuffers] += b.Bytes();
  return m;
}

std::map<std::string, int64_t> ZeroEngine::BytesSent() const {
  std::map<std::string, int64_t> sent = comm_->BytesSent();
  if (gather_comm_ != comm_) {
    for (const auto& [name, bytes] : gather_comm_->BytesSent()) sent[name] += bytes;
  }
  return sent;
}

int64_t ZeroEngine::AllocatedBytes() const {
  int64_t total =
      params_.Bytes() + grads_.Bytes() + master_.Bytes() + exp_avg_.Bytes() + exp_avg_sq_.Bytes();
  for (const Buffer& b : buckets_) total += b.Bytes();
  for (const Buffer& b : gathers_) total += b.Bytes();
  return total;
}

absl::StatusOr<std::vector<float>> ZeroEngine::FullMasterParameters() {
  ZEROD_ASSIGN_OR_RETURN(Buffer full,
                         Buffer::Allocate(ops_, DType::kFloat32, plan_->padded_numel()));
  float* master = Master();
  for (const plan::OwnedRange& r : plan_->OwnedRanges(rank_)) {
    const int64_t from = (mixed() || stage_ == 3) ? r.shard_offset : r.flat_offset;
    ZEROD_RETURN_IF_ERROR(ops_->Copy(full.f32() + r.flat_offset, master + from, r.numel * 4));
  }
  if (stage_ > 0) {
    for (const plan::Segment& seg : plan_->segments()) {
      log_.Record("all_gather", seg.slice_numel, DType::kFloat32);
      ZEROD_RETURN_IF_ERROR(
          Wait(comm_->AllGather(full.f32() + seg.flat_offset, seg.slice_numel, DType::kFloat32)));
    }
  }
  std::vector<float> host(static_cast<size_t>(plan_->padded_numel()));
  ZEROD_RETURN_IF_ERROR(ops_->Download(host.data(), full.data(), full.Bytes()));
  std::vector<float> out;
  out.reserve(static_cast<size_t>(plan_->total_numel()));
  for (const plan::TensorPlacement& place : plan_->placements()) {
    out.insert(out.end(), host.begin() + place.flat_offset,
               host.begin() + place.flat_offset + place.numel);
  }
  return out;
}

}  // namespace zerod::engine
