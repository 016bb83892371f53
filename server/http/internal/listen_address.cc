#include "server/http/internal/listen_address.h"

#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace zerod::http::internal {

absl::StatusOr<ListenAddress> ParseListenAddress(const std::string& address) {
  const auto invalid = [&address](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("HTTP listen address '", address, "': ", why,
                                                   " (expected HOST:PORT, [IPV6]:PORT or :PORT)"));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return invalid("no port");
  ListenAddress out;
  std::string host = address.substr(0, colon);
  const std::string port_text = address.substr(colon + 1);
  if (!absl::SimpleAtoi(port_text, &out.port) || out.port < 0 || out.port > 65535) {
    return invalid(absl::StrCat("port '", port_text, "' is not a number from 0 to 65535"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string::npos) {
    return invalid("an IPv6 address needs brackets");
  }
  out.host = host;
  if (host.empty()) {
    out.any = true;
    out.family = AF_INET6;
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_addr = in6addr_any;
    in6->sin6_port = htons(static_cast<uint16_t>(out.port));
    return out;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || found == nullptr) {
    return invalid(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  out.family = found->ai_family;
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  if (out.family == AF_INET6) {
    reinterpret_cast<sockaddr_in6*>(&out.storage)->sin6_port =
        htons(static_cast<uint16_t>(out.port));
  } else {
    reinterpret_cast<sockaddr_in*>(&out.storage)->sin_port = htons(static_cast<uint16_t>(out.port));
  }
  return out;
}

}  // namespace zerod::http::internal
