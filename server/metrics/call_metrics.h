#ifndef ZEROD_SERVER_METRICS_CALL_METRICS_H_
#define ZEROD_SERVER_METRICS_CALL_METRICS_H_

// A gRPC server interceptor that counts every call by method and status code and times it
// (zerod_grpc_calls_total, zerod_grpc_call_duration_seconds); calls to the Store service also
// count as store operations by their name (zerod_store_operations_total, ..._duration_seconds).
//
// A method the server does not serve (a client's typo, a scanner) is labelled "other", so callers
// cannot grow the label set. A call cancelled before it sends a status is not counted.

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <string>
#include <vector>

namespace zerod::metrics {

class CallMetricsInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

// For ServerBuilder::experimental().SetInterceptorCreators.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
CallMetricsInterceptors();

// The method's label: "/package.Service/Method" when the process knows it, "other" otherwise.
std::string MethodLabel(const std::string& method);

}  // namespace zerod::metrics

#endif  // ZEROD_SERVER_METRICS_CALL_METRICS_H_
