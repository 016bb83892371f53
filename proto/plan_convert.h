#ifndef ZEROD_PROTO_PLAN_CONVERT_H_
#define ZEROD_PROTO_PLAN_CONVERT_H_

// Conversions between runtime/plan's inputs and their wire form (zerod/v1/plan.proto).

#include <vector>

#include "absl/status/statusor.h"
#include "runtime/plan/plan_input.h"
#include "runtime/plan/shard_plan.h"
#include "zerod/v1/plan.pb.h"

namespace zerod::rpc {

v1::DType ToProto(DType t);
DType FromProto(v1::DType t);  // UNSPECIFIED -> bf16

void ToProto(const std::vector<plan::TensorSpec>& tensors,
             google::protobuf::RepeatedPtrField<v1::TensorSpec>* out);
std::vector<plan::TensorSpec> FromProto(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& tensors);

// Options with zero fields replaced by runtime/plan's defaults; world size and budget are not
// part of the message and are set by the caller.
plan::PlanOptions FromProto(const v1::PlanOptions& options);
v1::PlanOptions ToProto(const plan::PlanOptions& options);

// Recomputes the ShardPlan from wire inputs and checks it against their digest: what every rank
// and the daemon's inspect service do. FAILED_PRECONDITION when the digests differ.
absl::StatusOr<plan::ShardPlan> PlanFromInputs(const v1::PlanInputs& inputs);

}  // namespace zerod::rpc

#endif  // ZEROD_PROTO_PLAN_CONVERT_H_
