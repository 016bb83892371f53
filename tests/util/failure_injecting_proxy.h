#ifndef ZEROD_TESTS_UTIL_FAILURE_INJECTING_PROXY_H_
#define ZEROD_TESTS_UTIL_FAILURE_INJECTING_PROXY_H_

// A TCP proxy on loopback for failure injection: it forwards bytes between its clients and one
// upstream address, and on demand swallows the replies (the request arrives and is acted on, the
// answer never comes back: a call whose outcome the client cannot know) or cuts every connection.
//
// Owns an accept thread and one thread per connection; the destructor stops and joins them.

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zerod::testing {

class FailureInjectingProxy {
 public:
  // Forwards to `upstream` ("127.0.0.1:port").
  explicit FailureInjectingProxy(const std::string& upstream);
  ~FailureInjectingProxy();
  FailureInjectingProxy(const FailureInjectingProxy&) = delete;
  FailureInjectingProxy& operator=(const FailureInjectingProxy&) = delete;

  // "127.0.0.1:port" to connect to instead of upstream.
  std::string address() const;
  // While true, bytes from upstream are read and dropped.
  void DropReplies(bool drop) { drop_replies_ = drop; }
  // Cuts every open connection (clients reconnect through the proxy).
  void CloseConnections();

 private:
  void AcceptLoop();
  void Pump(int client, int server);

  int listen_fd_ = -1;
  int port_ = 0;
  int upstream_port_ = 0;
  std::atomic<bool> drop_replies_{false};
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::vector<int> open_fds_;       // guarded by mu_
  std::vector<std::thread> pumps_;  // guarded by mu_
  std::thread acceptor_;
};

}  // namespace zerod::testing

#endif  // ZEROD_TESTS_UTIL_FAILURE_INJECTING_PROXY_H_
