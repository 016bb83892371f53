// ZeroEngine's optimizer step: the reduction, the agreement between ranks, and Adam over
// parameter groups with per-tensor step counts (the rest of the engine is zero_engine.cc).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/engine/zero_engine.h"

namespace zerod::engine {

absl::Status ZeroEngine::CheckGroups(const ParamGroups& groups) const {
  const size_t tensors = plan_->tensors().size();
  if (groups.tensor_group.size() != tensors) {
    return absl::InvalidArgumentError(absl::StrCat("engine: groups given for ",
                                                   groups.tensor_group.size(),
                                                   " tensors; the model has ", tensors));
  }
  const int64_t count = static_cast<int64_t>(groups.configs.size());
  for (size_t t = 0; t < tensors; ++t) {
    const int32_t g = groups.tensor_group[t];
    if (g != kNotOptimized && (g < 0 || g >= count)) {
      return absl::InvalidArgumentError(absl::StrCat("engine: tensor '", plan_->tensors()[t].name,
                                                     "' is in group ", g, "; there are ", count));
    }
  }
  for (int64_t g = 0; g < count; ++g) {
    const optim::AdamConfig& c = groups.configs[static_cast<size_t>(g)];
    // torch.optim's ranges; a value outside one would make the step meaningless, not fail.
    const char* bad = nullptr;
    if (!std::isfinite(c.lr) || c.lr < 0) bad = "lr";
    if (!(c.beta1 >= 0 && c.beta1 < 1)) bad = "beta1";
    if (!(c.beta2 >= 0 && c.beta2 < 1)) bad = "beta2";
    if (!std::isfinite(c.eps) || c.eps < 0) bad = "eps";
    if (!std::isfinite(c.weight_decay) || c.weight_decay < 0) bad = "weight_decay";
    if (bad != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("engine: group ", g, ": ", bad, " is out of range (lr ", c.lr, ", betas (",
                       c.beta1, ", ", c.beta2, "), eps ", c.eps, ", weight_decay ", c.weight_decay,
                       "; expected lr, eps and weight_decay finite and >= 0, betas in [0, 1))"));
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::ReduceGradients() {
  const DType gd = grad_dtype();
  if (stage_ >= 2) {
    for (BucketBuffer& bucket : buckets_) ZEROD_RETURN_IF_ERROR(FinishReduceScatter(bucket));
    return absl::OkStatus();
  }
  if (stage_ == 0) {
    log_.Record("all_reduce", grads_.memory.numel(), gd);
    return Wait(comm_->AllReduce(grads_.memory.data(), grads_.memory.numel(), gd),
                WaitFor::kReduce);
  }
  // Every segment at once: one grouped collective, not one per segment.
  return Wait(comm_->ReduceScatterGroup(SegmentsOf(grads_, "reduce_scatter", gd), gd),
              WaitFor::kReduce);
}

absl::StatusOr<ZeroEngine::Agreement> ZeroEngine::Agree(bool need_norm) {
  Agreement agreed;
  double sum_squares = 0;
  bool overflow = false;
  if (need_norm) {
    for (const plan::OwnedRange& r : plan_->OwnedRanges(rank_)) {
      ZEROD_RETURN_IF_ERROR(
          ops_->SumSquares(grad_dtype(), grads_.Slice(r), r.real_numel, &sum_squares, &overflow));
    }
  }
  // One all-reduce (a sum) carries the overflow flag, the squared norm of each rank's slices
  // (stage 0: every rank holds the whole reduced gradient, so its own sum is the total) and, per
  // tensor, how many ranks gave it a gradient.
  const size_t tensors = has_grad_.size();
  std::vector<float> totals(2 + tensors, 0.0f);
  totals[0] = overflow ? 1.0f : 0.0f;
  totals[1] = stage_ > 0 ? static_cast<float>(sum_squares) : 0.0f;
  for (size_t t = 0; t < tensors; ++t) totals[2 + t] = has_grad_[t] ? 1.0f : 0.0f;
  const int64_t bytes = static_cast<int64_t>(totals.size() * sizeof(float));
  // Through the communicator's memory (the GPU with NCCL).
  ZEROD_RETURN_IF_ERROR(ops_->Upload(totals_.data(), totals.data(), bytes));
  log_.Record("all_reduce", static_cast<int64_t>(totals.size()), DType::kFloat32);
  ZEROD_RETURN_IF_ERROR(
      Wait(comm_->AllReduce(totals_.data(), static_cast<int64_t>(totals.size()), DType::kFloat32),
           WaitFor::kReduce));
  ZEROD_RETURN_IF_ERROR(ops_->Download(totals.data(), totals_.data(), bytes));
  if (stage_ == 0) totals[1] = static_cast<float>(sum_squares);
  agreed.overflow = totals[0] > 0 || !std::isfinite(totals[1]);
  agreed.sum_squares = totals[1];
  agreed.tensor_stepped.resize(tensors);
  for (size_t t = 0; t < tensors; ++t) agreed.tensor_stepped[t] = totals[2 + t] > 0;
  return agreed;
}

std::vector<optim::AdamRun> ZeroEngine::AdamRuns(const ParamGroups& groups,
                                                 const std::vector<bool>& stepped,
                                                 float grad_multiplier) {
  // Each tensor's scalars, by (group, step count): few distinct pairs, each computed once.
  std::map<std::pair<int32_t, int64_t>, optim::AdamScalars> scalars;
  std::vector<const optim::AdamScalars*> of_tensor(stepped.size(), nullptr);
  for (size_t t = 0; t < stepped.size(); ++t) {
    const int32_t g = groups.tensor_group[t];
    if (!stepped[t] || g == kNotOptimized) continue;
    const std::pair<int32_t, int64_t> key{g, tensor_steps_[t]};
    auto it = scalars.find(key);
    if (it == scalars.end()) {
      it = scalars
               .emplace(key, optim::MakeAdamScalars(groups.configs[static_cast<size_t>(g)],
                                                    key.second, grad_multiplier))
               .first;
    }
    of_tensor[t] = &it->second;
  }
  std::vector<optim::AdamRun> runs;
  for (const plan::OwnedRange& r : plan_->OwnedRanges(rank_)) {
    const plan::Segment& seg = plan_->segments()[static_cast<size_t>(r.segment)];
    const optim::AdamScalars* last = nullptr;  // of the run being extended
    int64_t run_end = -1;                      // in the slice, where the last run ends
    for (int64_t t = seg.first_tensor; t < seg.first_tensor + seg.tensor_count; ++t) {
      const plan::TensorPlacement& place = plan_->placements()[static_cast<size_t>(t)];
      // The tensor's elements inside this slice, as offsets in the slice.
      const int64_t begin = std::max(place.segment_offset, r.segment_offset) - r.segment_offset;
      const int64_t end = std::min(place.segment_offset + place.numel, r.segment_offset + r.numel) -
                          r.segment_offset;
      const optim::AdamScalars* k = of_tensor[static_cast<size_t>(t)];
      if (begin >= end || k == nullptr) continue;
      // Tensors with the same scalars, one right after the other, step as one run.
      if (last != nullptr && (k == last || std::memcmp(k, last, sizeof(*k)) == 0) &&
          begin == run_end) {
        runs.back().shard.numel += end - begin;
        run_end = end;
        continue;
      }
      optim::AdamShard shard;
      shard.param = Master().F32Slice(r) + begin;
      shard.exp_avg = exp_avg_.F32Slice(r) + begin;
      shard.exp_avg_sq = exp_avg_sq_.F32Slice(r) + begin;
      shard.grad = grads_.Slice(r) + begin * DTypeBytes(grad_dtype());
      shard.grad_dtype = grad_dtype();
      if (mixed()) {
        shard.low_precision = params_.Slice(r) + begin * DTypeBytes(param_dtype());
        shard.low_precision_dtype = param_dtype();
      }
      shard.numel = end - begin;
      runs.push_back({shard, *k});
      last = k;
      run_end = end;
    }
  }
  return runs;
}

absl::StatusOr<StepResult> ZeroEngine::Step(const ParamGroups& groups) {
  if (grads_this_micro_ != 0 ||
      (micro_steps_ != 0 && micro_steps_ != options_.accumulation_steps)) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine: Step after ", micro_steps_, " complete micro-steps (and ",
                     grads_this_micro_, " gradients of the next); expected ",
                     options_.accumulation_steps, " (or none, after ZeroGrad)"));
  }
  ZEROD_RETURN_IF_ERROR(CheckGroups(groups));
  // Stage 3: the step changes the parameters.
  ZEROD_RETURN_IF_ERROR(DropGatheredUnits());
  ZEROD_RETURN_IF_ERROR(ReduceGradients());
  const double scale = scaler_.scale();
  const double micro =
      options_.average_accumulation ? static_cast<double>(options_.accumulation_steps) : 1.0;
  const double mean = 1.0 / (scale * static_cast<double>(plan_->world_size()) * micro);
  StepResult result;
  result.loss_scale = scale;
  const bool need_norm = options_.loss_scale.enabled || options_.max_grad_norm > 0;
  ZEROD_ASSIGN_OR_RETURN(const Agreement agreed, Agree(need_norm));
  double coefficient = 1.0;
  if (need_norm) {
    result.grad_norm = std::sqrt(agreed.sum_squares) * mean;
    if (!scaler_.Update(agreed.overflow)) {
      // Skipped on every rank: they all saw the same totals.
      ZEROD_RETURN_IF_ERROR(grads_.memory.Zero(0, grads_.memory.numel()));
      micro_steps_ = 0;
      result.applied = false;
      steps_taken_.fetch_add(1, std::memory_order_relaxed);
      return result;
    }
    if (options_.max_grad_norm > 0 && result.grad_norm > 0) {
      coefficient = std::min(1.0, options_.max_grad_norm / (result.grad_norm + 1e-6));
    }
  }
  // Adam on the owned shard, each tensor at its own step count.
  for (size_t t = 0; t < agreed.tensor_stepped.size(); ++t) {
    if (agreed.tensor_stepped[t] && groups.tensor_group[t] != kNotOptimized) ++tensor_steps_[t];
  }
  const int64_t step = ++step_;  // only the trainer's thread touches step_
  ZEROD_RETURN_IF_ERROR(BeginShardWrite());
  ZEROD_RETURN_IF_ERROR(
      ops_->Adam(AdamRuns(groups, agreed.tensor_stepped, static_cast<float>(mean * coefficient))));
  ZEROD_RETURN_IF_ERROR(ops_->Synchronize());
  EndShardWrite();
  // Every rank gets the new parameters (stages 1-2).
  ZEROD_RETURN_IF_ERROR(GatherParameters());
  ZEROD_RETURN_IF_ERROR(grads_.memory.Zero(0, grads_.memory.numel()));
  ZEROD_RETURN_IF_ERROR(ops_->Synchronize());
  micro_steps_ = 0;
  result.applied = true;
  steps_taken_.fetch_add(1, std::memory_order_relaxed);
  if (options_.check_store && options_.check_every > 0 && step % options_.check_every == 0) {
    absl::Status check = log_.Compare(*options_.check_store, absl::StrCat("step-", step), rank_,
                                      plan_->world_size(), options_.collective_timeout);
    if (!check.ok()) return Blame(check, absl::OkStatus());
  }
  return result;
}

absl::Status ZeroEngine::ZeroGrad(bool set_to_none) {
  if (grads_this_micro_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("engine: ZeroGrad in the middle of a micro-step (", grads_this_micro_, " of ",
                     plan_->tensors().size(), " gradients given)"));
  }
  // Nothing given since the last Step or ZeroGrad (zero_grad at the top of a loop): the buffers
  // are zero already, and a call costs nothing.
  if (micro_steps_ > 0) {
    // Reductions in flight land first: their buffers are then free and zeroed.
    LaunchHeldReduces();
    for (BucketBuffer& bucket : buckets_) ZEROD_RETURN_IF_ERROR(FinishReduceScatter(bucket));
    ZEROD_RETURN_IF_ERROR(grads_.memory.Zero(0, grads_.memory.numel()));
    ZEROD_RETURN_IF_ERROR(ops_->Synchronize());
    micro_steps_ = 0;
  }
  if (set_to_none) std::fill(has_grad_.begin(), has_grad_.end(), false);
  return absl::OkStatus();
}

}  // namespace zerod::engine
