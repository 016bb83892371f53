#include "proto/plan_convert.h"

#include "absl/strings/str_cat.h"

namespace zerod::rpc {

v1::DType ToProto(DType t) {
  switch (t) {
    case DType::kFloat32:
      return v1::DTYPE_FP32;
    case DType::kBFloat16:
      return v1::DTYPE_BF16;
    case DType::kFloat16:
      return v1::DTYPE_FP16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

DType FromProto(v1::DType t) {
  switch (t) {
    case v1::DTYPE_FP32:
      return DType::kFloat32;
    case v1::DTYPE_FP16:
      return DType::kFloat16;
    default:
      return DType::kBFloat16;
  }
}

void ToProto(const std::vector<plan::TensorSpec>& tensors,
             google::protobuf::RepeatedPtrField<v1::TensorSpec>* out) {
  out->Reserve(static_cast<int>(tensors.size()));
  for (const plan::TensorSpec& t : tensors) {
    v1::TensorSpec* p = out->Add();
    p->set_name(t.name);
    for (int64_t d : t.shape) p->add_shape(d);
    p->set_dtype(ToProto(t.dtype));
    p->set_unit(t.unit);
  }
}

std::vector<plan::TensorSpec> FromProto(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& tensors) {
  std::vector<plan::TensorSpec> out;
  out.reserve(static_cast<size_t>(tensors.size()));
  for (const v1::TensorSpec& p : tensors) {
    out.push_back({p.name(), {p.shape().begin(), p.shape().end()}, FromProto(p.dtype()), p.unit()});
  }
  return out;
}

plan::PlanOptions FromProto(const v1::PlanOptions& p) {
  plan::PlanOptions o;
  o.stage = p.stage();
  o.param_dtype = FromProto(p.param_dtype());
  o.grad_dtype =
      p.grad_dtype() == v1::DTYPE_UNSPECIFIED ? o.param_dtype : FromProto(p.grad_dtype());
  o.optimizer =
      p.optimizer() == v1::OPTIMIZER_ADAMW ? plan::Optimizer::kAdamW : plan::Optimizer::kAdam;
  if (p.partition_alignment_numel() > 0)
    o.partition_alignment_numel = p.partition_alignment_numel();
  if (p.reduce_bucket_bytes() > 0) o.reduce_bucket_bytes = p.reduce_bucket_bytes();
  if (p.bucket_buffers() > 0) o.bucket_buffers = p.bucket_buffers();
  if (p.gather_unit_bytes() > 0) o.gather_unit_bytes = p.gather_unit_bytes();
  if (p.prefetch_depth() > 0) o.prefetch_depth = p.prefetch_depth();
  if (p.max_live_units() > 0) o.max_live_units = p.max_live_units();
  return o;
}

v1::PlanOptions ToProto(const plan::PlanOptions& o) {
  v1::PlanOptions p;
  p.set_stage(o.stage);
  p.set_param_dtype(ToProto(o.param_dtype));
  p.set_grad_dtype(ToProto(o.grad_dtype));
  p.set_optimizer(o.optimizer == plan::Optimizer::kAdamW ? v1::OPTIMIZER_ADAMW
                                                         : v1::OPTIMIZER_ADAM);
  p.set_partition_alignment_numel(o.partition_alignment_numel);
  p.set_reduce_bucket_bytes(o.reduce_bucket_bytes);
  p.set_bucket_buffers(o.bucket_buffers);
  p.set_gather_unit_bytes(o.gather_unit_bytes);
  p.set_prefetch_depth(o.prefetch_depth);
  p.set_max_live_units(o.max_live_units);
  return p;
}

absl::StatusOr<plan::ShardPlan> PlanFromInputs(const v1::PlanInputs& inputs) {
  plan::PlanInput in;
  in.tensors = FromProto(inputs.tensors());
  in.options = FromProto(inputs.options());
  in.options.world_size = inputs.world_size();
  auto plan = plan::ShardPlan::Create(std::move(in));
  if (!plan.ok()) return plan.status();
  if (plan->DigestHex() != inputs.plan_digest()) {
    return absl::FailedPreconditionError(
        absl::StrCat("plan digest mismatch: recomputed ", plan->DigestHex(), ", the daemon sent ",
                     inputs.plan_digest(), " (zerod and this client run different planners?)"));
  }
  return plan;
}

}  // namespace zerod::rpc
