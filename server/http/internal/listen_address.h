#ifndef ZEROD_SERVER_HTTP_INTERNAL_LISTEN_ADDRESS_H_
#define ZEROD_SERVER_HTTP_INTERNAL_LISTEN_ADDRESS_H_

// The HTTP listener's address syntax, as the gRPC listener's: "127.0.0.1:9464", "[::1]:0",
// "localhost:9464", ":9464" (every address, IPv6 and IPv4).

#include <sys/socket.h>

#include <string>

#include "absl/status/statusor.h"

namespace zerod::http::internal {

struct ListenAddress {
  std::string host;  // as given ("" for every address), brackets removed
  int port = 0;
  bool any = false;  // ":PORT": bind every address
  int family = AF_INET;
  sockaddr_storage storage{};  // the address to bind, port included
};

// INVALID_ARGUMENT naming the address and what is wrong with it.
absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& address);

}  // namespace zerod::http::internal

#endif  // ZEROD_SERVER_HTTP_INTERNAL_LISTEN_ADDRESS_H_
