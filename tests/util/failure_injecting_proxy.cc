#include "tests/util/failure_injecting_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <stdexcept>

namespace zerod::testing {
namespace {

sockaddr_in Loopback(int port) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  return address;
}

// Writes all of `data`; false when the peer is gone.
bool WriteAll(int fd, const char* data, ssize_t size) {
  while (size > 0) {
    const ssize_t n = send(fd, data, static_cast<size_t>(size), MSG_NOSIGNAL);
    if (n <= 0) return false;
    data += n;
    size -= n;
  }
  return true;
}

}  // namespace

FailureInjectingProxy::FailureInjectingProxy(const std::string& upstream) {
  const size_t colon = upstream.rfind(':');
  if (colon == std::string::npos || upstream.substr(0, colon) != "127.0.0.1") {
    throw std::invalid_argument("FailureInjectingProxy forwards to 127.0.0.1:port, not " +
                                upstream);
  }
  upstream_port_ = std::stoi(upstream.substr(colon + 1));
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = Loopback(0);
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listen_fd_, 16) != 0) {
    throw std::runtime_error("FailureInjectingProxy: cannot listen on loopback");
  }
  socklen_t size = sizeof(address);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&address), &size);
  port_ = ntohs(address.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

FailureInjectingProxy::~FailureInjectingProxy() {
  stopping_ = true;
  acceptor_.join();
  CloseConnections();
  std::vector<std::thread> pumps;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pumps.swap(pumps_);
  }
  for (std::thread& t : pumps) t.join();
  close(listen_fd_);
}

std::string FailureInjectingProxy::address() const { return "127.0.0.1:" + std::to_string(port_); }

void FailureInjectingProxy::CloseConnections() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);
}

void FailureInjectingProxy::AcceptLoop() {
  while (!stopping_) {
    pollfd waiting{listen_fd_, POLLIN, 0};
    if (poll(&waiting, 1, 50) <= 0) continue;
    const int client = accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in upstream = Loopback(upstream_port_);
    if (connect(server, reinterpret_cast<sockaddr*>(&upstream), sizeof(upstream)) != 0) {
      close(server);
      close(client);
      continue;
    }
    const int one = 1;
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu_);
    open_fds_.push_back(client);
    open_fds_.push_back(server);
    pumps_.emplace_back([this, client, server] { Pump(client, server); });
  }
}

void FailureInjectingProxy::Pump(int client, int server) {
  char buffer[16384];
  while (!stopping_) {
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    if (poll(fds, 2, 50) <= 0) continue;
    if (fds[0].revents != 0) {
      const ssize_t n = recv(client, buffer, sizeof(buffer), 0);
      if (n <= 0 || !WriteAll(server, buffer, n)) break;
    }
    if (fds[1].revents != 0) {
      const ssize_t n = recv(server, buffer, sizeof(buffer), 0);
      if (n <= 0) break;
      if (!drop_replies_ && !WriteAll(client, buffer, n)) break;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : {client, server}) {
    open_fds_.erase(std::remove(open_fds_.begin(), open_fds_.end(), fd), open_fds_.end());
    close(fd);
  }
}

}  // namespace zerod::testing
