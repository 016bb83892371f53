#ifndef ZEROD_RUNTIME_COMM_GLOO_LEAD_MESH_H_
#define ZEROD_RUNTIME_COMM_GLOO_LEAD_MESH_H_

// The TCP connections a Gloo communicator's leads (lead_exchange.h) travel on: one to each lead
// peer, of their own, read and written by the thread running the collective.
//
// Why not Gloo's pairs: a message through Gloo's TCP transport is three on the wire (the receiver
// says its receive is posted, the sender says a send is coming, then the data) and each is read
// by Gloo's device thread, which then wakes the waiting one: a lead exchange cost several loopback
// round trips (docs/decisions/0014). Here a lead is one write and one read, by the threads that
// need it.
//
// Frames: a 4-byte length, then that many bytes (at most `max_frame`). Frames from one peer
// arrive in order; a frame a peer sent ahead of this rank is kept until it is asked for, so two
// ranks that both write never wait on each other. Close() (any thread) shuts every connection
// down: peers see it at once, and a wait here fails.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/store.h"

namespace zerod::comm::internal {

class LeadMesh {
 public:
  // Connects this rank to each of `peers` (which must list this rank as a peer too): listens on
  // `hostname`, publishes its address under `key_prefix`/<rank> in `store`, connects to the lower
  // ranks, accepts the higher. A connection that does not start with the mesh's hello (its magic,
  // a nonce rank 0 publishes, and the ranks at both ends) is closed and not counted.
  static absl::StatusOr<std::unique_ptr<LeadMesh>> Connect(
      Store& store, const std::string& key_prefix, int64_t rank, const std::vector<int>& peers,
      const std::string& hostname, size_t max_frame, absl::Duration timeout);
  ~LeadMesh();
  LeadMesh(const LeadMesh&) = delete;
  LeadMesh& operator=(const LeadMesh&) = delete;

  // Queues a frame of `header` then `payload` to `peer` and writes what the socket takes now.
  // Throws std::runtime_error once the mesh is closed or the connection failed.
  void Send(int peer, const void* header, size_t header_bytes, const void* payload,
            size_t payload_bytes);
  // Waits for the next frame from `peer` and moves it into `frame` (its old storage reused),
  // writing queued sends meanwhile. Throws std::runtime_error naming the peer if the connection
  // closes or fails, the frame is too long, `timeout` passes, or Close() was called.
  void Receive(int peer, std::vector<char>& frame, std::chrono::milliseconds timeout);
  // Writes every queued send (reading what arrives meanwhile); throws as Receive does.
  void Flush(std::chrono::milliseconds timeout);
  // Shuts every connection down and wakes a wait; any thread, any number of times.
  void Close();
  // How long a wait polls without blocking, yielding its CPU between polls, before it sleeps (0:
  // it sleeps at once). By the thread running the collective, for its waits.
  void SetSpin(std::chrono::microseconds spin) { spin_ = spin; }
  // The rounds of waiting so far that spun (polled without blocking first), and those that slept
  // (blocked in poll: at once, or after spinning in vain). A frame that was in already costs no
  // round; one that comes in parts, or a wait for room to write, may cost several. Any thread; for
  // tests and benchmarks.
  struct Waits {
    int64_t spun = 0;
    int64_t slept = 0;
  };
  Waits waits() const { return {spun_.load(), slept_.load()}; }

 private:
  struct Peer;
  LeadMesh(std::vector<std::unique_ptr<Peer>> peers, int wake_fd, size_t max_frame);
  Peer& Find(int peer);
  // Polls until `done()` (checked after each round of reads and writes) or the deadline.
  template <typename Done>
  void Pump(const Done& done, std::chrono::milliseconds timeout, const char* waiting_for, int peer);
  // Reads what `p`'s socket holds into its frames (a long one in part: see kDirectReadBytes).
  void ReadAvailable(Peer& p);
  // Writes what `p`'s socket takes of its queued sends.
  void WriteAvailable(Peer& p);
  [[noreturn]] void Fail(Peer& p, const std::string& what);

  std::vector<std::unique_ptr<Peer>> peers_;
  const int wake_fd_;  // an eventfd Close() writes to
  const size_t max_frame_;
  std::atomic<bool> closed_{false};
  std::chrono::microseconds spin_{0};
  std::atomic<int64_t> spun_{0}, slept_{0};
};

}  // namespace zerod::comm::internal

#endif  // ZEROD_RUNTIME_COMM_GLOO_LEAD_MESH_H_
