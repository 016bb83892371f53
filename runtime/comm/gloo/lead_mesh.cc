#include "runtime/comm/gloo/lead_mesh.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <stdexcept>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace zerod::comm::internal {
namespace {

using Clock = std::chrono::steady_clock;

// A frame longer than this, not all in when its length is read, is read straight into storage of
// its own: one copy fewer than through the inbox (a 2-rank broadcast's lead carries up to 2 MiB).
// Shorter frames share the inbox's reads.
constexpr size_t kDirectReadBytes = size_t{16} << 10;

// What a failed lead connection says of the peer; `how` is the socket's error, if any.
std::string ClosedByPeer(const char* how) {
  return absl::StrCat("closed its lead connection",
                      *how != '\0' ? absl::StrCat(" (", how, ")") : "",
                      ": it failed a collective, and its own error says why, or it exited");
}

constexpr uint64_t kHelloMagic = 0x3168736d64614c7a;  // "zLadmsh1", a hello of this version

// What a connecting rank sends first: whom it is, whom it meant, and the mesh's nonce, so that a
// stray connection (another job's, a scanner's) is not taken for a peer.
struct Hello {
  uint64_t magic = kHelloMagic;
  uint64_t nonce = 0;
  int64_t from = 0;
  int64_t to = 0;
};

// Closes a descriptor on every path out of Connect that does not hand it to the mesh.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      if (fd_ >= 0) ::close(fd_);
      fd_ = o.release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

absl::Status Errno(const std::string& what) {
  return absl::UnavailableError(absl::StrCat("lead mesh: ", what, ": ", std::strerror(errno)));
}

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
}

// Waits for `events` on `fd` until the deadline; false when it passes.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, RemainingMs(deadline));
    if (n > 0) return true;
    if (n == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Reads exactly `bytes` from a non-blocking socket before the deadline.
bool ReadExactly(int fd, void* out, size_t bytes, Clock::time_point deadline) {
  char* p = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
    } else if (n == 0) {
      return false;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!WaitFor(fd, POLLIN, deadline)) return false;
    } else if (errno != EINTR) {
      return false;
    }
  }
  return true;
}

bool WriteExactly(int fd, const void* data, size_t bytes, Clock::time_point deadline) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFor(fd, POLLOUT, deadline)) return false;
    } else if (n < 0 && errno != EINTR) {
      return false;
    }
  }
  return true;
}

void Tune(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// "<numeric address> <port>" of a bound socket, as peers connect to it.
absl::StatusOr<std::string> AddressOf(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("getsockname");
  }
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return absl::UnavailableError("lead mesh: cannot name the listening address");
  }
  return absl::StrCat(host, " ", port);
}

// Connects to "<address> <port>" before the deadline.
absl::StatusOr<Fd> ConnectTo(const std::string& where, Clock::time_point deadline) {
  std::vector<std::string> parts = absl::StrSplit(where, ' ');
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (parts.size() != 2 || ::getaddrinfo(parts[0].c_str(), parts[1].c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("lead mesh: a peer published '", where, "', not an address and a port"));
  }
  Fd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  int rc = fd.get() < 0 ? -1 : ::connect(fd.get(), found->ai_addr, found->ai_addrlen);
  const int connect_errno = errno;
  ::freeaddrinfo(found);
  if (fd.get() < 0) return Errno("socket");
  if (rc != 0 && connect_errno != EINPROGRESS) {
    errno = connect_errno;
    return Errno(absl::StrCat("connect to ", where));
  }
  if (rc != 0) {
    if (!WaitFor(fd.get(), POLLOUT, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("lead mesh: connect to ", where));
    }
    int error = 0;
    socklen_t len = sizeof(error);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len);
    if (error != 0) {
      errno = error;
      return Errno(absl::StrCat("connect to ", where));
    }
  }
  return fd;
}

}  // namespace

struct LeadMesh::Peer {
  int rank = 0;
  int fd = -1;
  std::vector<char> inbox;  // holds `received` bytes read and not yet cut into frames
  size_t received = 0;
  // A frame longer than kDirectReadBytes that was not all in when its length was read: its first
  // `long_have` bytes are in, and the rest is read straight into it (not through the inbox).
  std::vector<char> long_frame;
  size_t long_have = 0;
  bool reading_long = false;
  std::deque<std::vector<char>> frames;
  std::deque<std::vector<char>> outbox;  // frames to write; the front's first `written` bytes are
  size_t written = 0;
  std::vector<std::vector<char>> spare;  // storage of frames taken, to reuse
  bool closed_by_peer = false;

  // Closes the connection on every path, a failed Connect's included.
  ~Peer() {
    if (fd >= 0) ::close(fd);
  }

  std::vector<char> Fresh() {
    if (spare.empty()) return {};
    // Not cleared: whoever takes it sets its size, and a long frame that fits in the old size
    // is not zero-filled first.
    std::vector<char> v = std::move(spare.back());
    spare.pop_back();
    return v;
  }
};

absl::StatusOr<std::unique_ptr<LeadMesh>> LeadMesh::Connect(
    Store& store, const std::string& key_prefix, int64_t rank, const std::vector<int>& peers,
    const std::string& hostname, size_t max_frame, absl::Duration timeout) {
  const Clock::time_point deadline = Clock::now() + absl::ToChronoMilliseconds(timeout);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(hostname.c_str(), "0", &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lead mesh: cannot resolve '", hostname, "': ", ::gai_strerror(rc)));
  }
  Fd listener(::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  const bool bound = listener.get() >= 0 &&
                     ::bind(listener.get(), found->ai_addr, found->ai_addrlen) == 0 &&
                     ::listen(listener.get(), static_cast<int>(peers.size()) + 16) == 0;
  ::freeaddrinfo(found);
  if (!bound) return Errno(absl::StrCat("listen on ", hostname));
  absl::StatusOr<std::string> address = AddressOf(listener.get());
  if (!address.ok()) return address.status();

  uint64_t nonce = 0;
  const std::string nonce_key = key_prefix + "nonce";
  if (rank == 0) {
    std::random_device random;
    nonce = (static_cast<uint64_t>(random()) << 32) ^ random();
    if (absl::Status s = store.Set(nonce_key, absl::StrCat(nonce)); !s.ok()) return s;
  } else {
    absl::StatusOr<std::string> text = store.Get(nonce_key, timeout);
    if (!text.ok()) return text.status();
    if (!absl::SimpleAtoi(*text, &nonce)) {
      return absl::InvalidArgumentError(absl::StrCat("lead mesh: nonce '", *text, "'"));
    }
  }
  if (absl::Status s = store.Set(key_prefix + absl::StrCat(rank), *address); !s.ok()) return s;

  std::vector<std::unique_ptr<Peer>> connected;
  for (int peer : peers) {
    if (peer >= rank) continue;
    absl::StatusOr<std::string> where = store.Get(key_prefix + absl::StrCat(peer), timeout);
    if (!where.ok()) return where.status();
    absl::StatusOr<Fd> fd = ConnectTo(*where, deadline);
    if (!fd.ok()) return fd.status();
    const Hello hello{kHelloMagic, nonce, rank, peer};
    if (!WriteExactly(fd->get(), &hello, sizeof(hello), deadline)) {
      return Errno(absl::StrCat("greet rank ", peer));
    }
    auto p = std::make_unique<Peer>();
    p->rank = peer;
    p->fd = fd->release();
    connected.push_back(std::move(p));
  }
  std::vector<int> awaited;
  for (int peer : peers) {
    if (peer > rank) awaited.push_back(peer);
  }
  while (!awaited.empty()) {
    if (!WaitFor(listener.get(), POLLIN, deadline)) {
      return absl::DeadlineExceededError(absl::StrCat(
          "lead mesh: rank ", rank, " waited ", absl::FormatDuration(timeout), " for rank ",
          awaited.front(), " (and ", awaited.size() - 1, " more) to connect"));
    }
    Fd fd(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.get() < 0) continue;  // gone already, or EAGAIN
    Hello hello;
    // A connection that says nothing is dropped after a second, not at the deadline.
    const Clock::time_point greeting = std::min(deadline, Clock::now() + std::chrono::seconds(1));
    if (!ReadExactly(fd.get(), &hello, sizeof(hello), greeting) || hello.magic != kHelloMagic ||
        hello.nonce != nonce || hello.to != rank) {
      continue;
    }
    auto it = std::find(awaited.begin(), awaited.end(), hello.from);
    if (it == awaited.end()) continue;
    awaited.erase(it);
    auto p = std::make_unique<Peer>();
    p->rank = static_cast<int>(hello.from);
    p->fd = fd.release();
    connected.push_back(std::move(p));
  }
  for (auto& p : connected) Tune(p->fd);
  std::sort(connected.begin(), connected.end(),
            [](const auto& a, const auto& b) { return a->rank < b->rank; });
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) return Errno("eventfd");
  return std::unique_ptr<LeadMesh>(new LeadMesh(std::move(connected), wake, max_frame));
}

LeadMesh::LeadMesh(std::vector<std::unique_ptr<Peer>> peers, int wake_fd, size_t max_frame)
    : peers_(std::move(peers)), wake_fd_(wake_fd), max_frame_(max_frame) {}

LeadMesh::~LeadMesh() { ::close(wake_fd_); }

void LeadMesh::Close() {
  if (closed_.exchange(true)) return;
  for (auto& p : peers_) ::shutdown(p->fd, SHUT_RDWR);
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

LeadMesh::Peer& LeadMesh::Find(int peer) {
  for (auto& p : peers_) {
    if (p->rank == peer) return *p;
  }
  throw std::logic_error(absl::StrCat("lead mesh: no connection to rank ", peer));
}

void LeadMesh::Fail(Peer& p, const std::string& what) {
  if (closed_.load()) throw std::runtime_error("the lead connections were closed");
  throw std::runtime_error(absl::StrCat("rank ", p.rank, " ", what));
}

void LeadMesh::ReadAvailable(Peer& p) {
  if (p.closed_by_peer) return;
  // Room for a whole frame that goes through the inbox and its length, and for what follows it.
  if (p.inbox.empty()) {
    p.inbox.resize(2 * (sizeof(uint32_t) + std::min(max_frame_, kDirectReadBytes)));
  }
  for (;;) {
    char* const into =
        p.reading_long ? p.long_frame.data() + p.long_have : p.inbox.data() + p.received;
    const size_t room =
        p.reading_long ? p.long_frame.size() - p.long_have : p.inbox.size() - p.received;
    const ssize_t n = ::recv(p.fd, into, room, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) {
      // Frames it sent before closing stay readable: a peer whose last collective is done may
      // close before this rank has taken that collective's lead.
      p.closed_by_peer = true;
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Fail(p, absl::StrCat("failed on its lead connection: ", std::strerror(errno)));
    }
    if (p.reading_long) {
      p.long_have += static_cast<size_t>(n);
      if (p.long_have == p.long_frame.size()) {
        p.frames.push_back(std::move(p.long_frame));
        p.reading_long = false;
      }
      continue;
    }
    p.received += static_cast<size_t>(n);
    size_t at = 0;
    while (p.received - at >= sizeof(uint32_t)) {
      uint32_t length = 0;
      std::memcpy(&length, p.inbox.data() + at, sizeof(length));
      if (length > max_frame_) {
        Fail(p, absl::StrCat("sent a lead of ", length, " bytes (at most ", max_frame_, ")"));
      }
      const char* start = p.inbox.data() + at + sizeof(length);
      const size_t have = p.received - at - sizeof(length);
      if (have < length) {
        if (length <= kDirectReadBytes) break;
        // Everything after its length in the inbox is this frame's; the rest goes straight in.
        p.long_frame = p.Fresh();
        p.long_frame.resize(length);
        std::memcpy(p.long_frame.data(), start, have);
        p.long_have = have;
        p.reading_long = true;
        at = p.received;
        break;
      }
      std::vector<char> frame = p.Fresh();
      frame.assign(start, start + length);
      p.frames.push_back(std::move(frame));
      at += sizeof(length) + length;
    }
    std::memmove(p.inbox.data(), p.inbox.data() + at, p.received - at);
    p.received -= at;
  }
}

void LeadMesh::WriteAvailable(Peer& p) {
  while (!p.outbox.empty()) {
    const std::vector<char>& front = p.outbox.front();
    const ssize_t n = ::send(p.fd, front.data() + p.written, front.size() - p.written,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      Fail(p, ClosedByPeer(std::strerror(errno)));
    }
    p.written += static_cast<size_t>(n);
    if (p.written == front.size()) {
      p.spare.push_back(std::move(p.outbox.front()));
      p.outbox.pop_front();
      p.written = 0;
    }
  }
}

void LeadMesh::Send(int peer, const void* header, size_t header_bytes, const void* payload,
                    size_t payload_bytes) {
  if (closed_.load()) throw std::runtime_error("the lead connections were closed");
  Peer& p = Find(peer);
  // A peer that closed its connection takes no part in this collective, though the socket would
  // take the write (and the lead it sent before closing would complete it here).
  ReadAvailable(p);
  if (p.closed_by_peer) Fail(p, ClosedByPeer(""));
  const uint32_t length = static_cast<uint32_t>(header_bytes + payload_bytes);
  size_t sent = 0;
  if (p.outbox.empty()) {
    // Most often the socket takes it all at once: no copy.
    iovec iov[3] = {{const_cast<uint32_t*>(&length), sizeof(length)},
                    {const_cast<void*>(header), header_bytes},
                    {const_cast<void*>(payload), payload_bytes}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = payload_bytes > 0 ? 3 : 2;
    ssize_t n;
    do {
      n = ::sendmsg(p.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      Fail(p, ClosedByPeer(std::strerror(errno)));
    }
    sent = static_cast<size_t>(std::max<ssize_t>(n, 0));
    if (sent == sizeof(length) + length) return;
  }
  std::vector<char> frame = p.Fresh();
  frame.resize(sizeof(length) + length);
  std::memcpy(frame.data(), &length, sizeof(length));
  std::memcpy(frame.data() + sizeof(length), header, header_bytes);
  if (payload_bytes > 0) {
    std::memcpy(frame.data() + sizeof(length) + header_bytes, payload, payload_bytes);
  }
  if (p.outbox.empty()) p.written = sent;
  p.outbox.push_back(std::move(frame));
  WriteAvailable(p);
}

template <typename Done>
void LeadMesh::Pump(const Done& done, std::chrono::milliseconds timeout, const char* waiting_for,
                    int peer) {
  const Clock::time_point deadline = Clock::now() + timeout;
  std::vector<pollfd> fds(peers_.size() + 1);
  for (;;) {
    if (closed_.load()) throw std::runtime_error("the lead connections were closed");
    if (done()) return;
    for (size_t i = 0; i < peers_.size(); ++i) {
      const Peer& p = *peers_[i];
      // A peer that closed, with nothing left to write to it, is left out: poll would report its
      // hang-up at once, every time (a busy loop until the lead waited for comes).
      const bool idle = p.closed_by_peer && p.outbox.empty();
      fds[i] = {
          idle ? -1 : p.fd,
          static_cast<short>((p.closed_by_peer ? 0 : POLLIN) | (p.outbox.empty() ? 0 : POLLOUT)),
          0};
    }
    fds.back() = {wake_fd_, POLLIN, 0};
    int n = 0;
    if (spin_.count() > 0) {
      // A peer's frame often comes sooner than a sleeping thread is woken for it (a wake-up can
      // cost as much as the loopback round trip). Between polls the thread yields its CPU: where
      // ranks outnumber CPUs the peer it waits for may need that CPU to send
      // (docs/decisions/0016).
      const Clock::time_point spin_until = std::min(Clock::now() + spin_, deadline);
      spun_.fetch_add(1, std::memory_order_relaxed);
      do {
        n = ::poll(fds.data(), fds.size(), 0);
        if (n == 0) ::sched_yield();
      } while (n == 0 && Clock::now() < spin_until);
    }
    if (n == 0) {
      slept_.fetch_add(1, std::memory_order_relaxed);
      n = ::poll(fds.data(), fds.size(), RemainingMs(deadline));
    }
    if (n < 0 && errno != EINTR) {
      throw std::runtime_error(
          absl::StrCat("poll on the lead connections: ", std::strerror(errno)));
    }
    if (n == 0) {
      throw std::runtime_error(
          absl::StrCat("no ", waiting_for, " rank ", peer, " within ", timeout.count(), " ms"));
    }
    for (size_t i = 0; n > 0 && i < peers_.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) ReadAvailable(*peers_[i]);
      if (fds[i].revents & POLLOUT) WriteAvailable(*peers_[i]);
    }
  }
}

void LeadMesh::Receive(int peer, std::vector<char>& frame, std::chrono::milliseconds timeout) {
  Peer& p = Find(peer);
  if (p.frames.empty()) ReadAvailable(p);
  Pump(
      [&] {
        if (!p.frames.empty()) return true;
        if (p.closed_by_peer) {
          Fail(p, ClosedByPeer(""));
        }
        return false;
      },
      timeout, "lead from", peer);
  std::swap(frame, p.frames.front());
  p.spare.push_back(std::move(p.frames.front()));
  p.frames.pop_front();
}

void LeadMesh::Flush(std::chrono::milliseconds timeout) {
  for (auto& p : peers_) {
    if (p->outbox.empty()) continue;
    Peer& q = *p;
    Pump([&] { return q.outbox.empty(); }, timeout, "room for a lead to", q.rank);
  }
}

}  // namespace zerod::comm::internal
