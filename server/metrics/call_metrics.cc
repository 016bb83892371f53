#include "server/metrics/call_metrics.h"

#include <google/protobuf/descriptor.h>

#include <cctype>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "server/metrics/server_metrics.h"

namespace zerod::metrics {
namespace {

constexpr char kStorePrefix[] = "/zerod.v1.Store/";

class CallMetricsInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit CallMetricsInterceptor(const std::string& method)
      : method_(MethodLabel(method)), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus());
    }
    methods->Proceed();
  }

 private:
  void Record(const grpc::Status& status) const {
    const absl::Duration took = absl::Now() - start_;
    const std::string code =
        absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
    const ServerMetrics& m = Metrics();
    m.grpc_calls.WithLabels({method_, code})->Increment();
    m.grpc_call_seconds.WithLabels({method_})->Observe(took);
    if (method_.starts_with(kStorePrefix)) {
      std::string op = method_.substr(sizeof(kStorePrefix) - 1);
      for (char& c : op) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      m.store_operations.WithLabels({op, code})->Increment();
      m.store_operation_seconds.WithLabels({op})->Observe(took);
    }
  }

  const std::string method_;
  const absl::Time start_;
};

}  // namespace

std::string MethodLabel(const std::string& method) {
  // gRPC's health service is not a generated proto here; its two methods are known by name.
  if (method == "/grpc.health.v1.Health/Check" || method == "/grpc.health.v1.Health/Watch") {
    return method;
  }
  const size_t slash = method.rfind('/');
  if (method.size() < 3 || method[0] != '/' || slash == 0 || slash == std::string::npos) {
    return "other";
  }
  std::string full_name = method.substr(1);
  full_name[slash - 1] = '.';
  return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full_name) != nullptr
             ? method
             : "other";
}

grpc::experimental::Interceptor* CallMetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new CallMetricsInterceptor(info->method() == nullptr ? "" : info->method());
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
CallMetricsInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<CallMetricsInterceptorFactory>());
  return creators;
}

}  // namespace zerod::metrics
