#ifndef ZEROD_PROTO_GRPC_STATUS_H_
#define ZEROD_PROTO_GRPC_STATUS_H_

// The one place absl::Status and grpc::Status are converted (codes map one to one).

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace zerod::rpc {

grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace zerod::rpc

#endif  // ZEROD_PROTO_GRPC_STATUS_H_
