#ifndef ZEROD_RUNTIME_COMM_GLOO_GLOO_COMMUNICATOR_H_
#define ZEROD_RUNTIME_COMM_GLOO_GLOO_COMMUNICATOR_H_

// The Communicator on Gloo's TCP transport, for host memory.
//
// Rendezvous goes through a comm::Store (the coordinator's in real runs). AllReduce, Broadcast and
// Barrier are Gloo's algorithms; ReduceScatter and AllGather are rings over Gloo's pairwise
// buffers (Gloo's new API has no reduce-scatter), so each rank sends exactly
// (world - 1) x chunk bytes, as the planner counts.
//
// Owns one thread that runs the collectives in call order (a Gloo context is not thread-safe);
// the destructor aborts what is queued and joins it.
//
// Abort (and a collective that fails) closes every connection first: the collective in flight
// fails at once on this rank and, through the closed connections, on its peers; no transfer can
// land in its buffers afterwards, and its Work reports the failure only once Gloo has let go of
// them. Creating one ignores SIGPIPE in the process if nothing handles it (Gloo's writes raise
// it on a connection the peer closed).

#include <deque>
#include <memory>
#include <thread>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/store.h"
#include "runtime/common/mutex.h"

namespace gloo {
class Context;
}

namespace zerod::comm {

struct GlooOptions {
  std::string hostname = "127.0.0.1";          // the address peers reach this rank at
  absl::Duration timeout = absl::Seconds(60);  // every collective and the rendezvous
};

class GlooCommunicator final : public Communicator {
 public:
  // Connects `world_size` ranks through `store` (keys under the store's namespace).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(std::shared_ptr<Store> store,
                                                                  int64_t rank, int64_t world_size,
                                                                  GlooOptions options);
  ~GlooCommunicator() override;

  int64_t rank() const override { return rank_; }
  int64_t world_size() const override { return world_size_; }
  std::unique_ptr<Work> AllReduce(void* data, int64_t count, DType dtype) override;
  std::unique_ptr<Work> ReduceScatter(void* data, int64_t chunk_count, DType dtype) override;
  std::unique_ptr<Work> AllGather(void* data, int64_t chunk_count, DType dtype) override;
  std::unique_ptr<Work> Broadcast(void* data, int64_t count, DType dtype, int64_t root) override;
  std::unique_ptr<Work> Barrier() override;
  void Abort(const absl::Status& why) override;
  std::map<std::string, int64_t> BytesSent() const override;
  std::map<std::string, int64_t> BytesReceived() const override;

  struct Op;

 private:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, int64_t rank, int64_t world_size,
                   GlooOptions options);
  std::unique_ptr<Work> Enqueue(std::string name, int64_t sent, int64_t received,
                                std::function<void()> body);
  void Loop();
  // Closes the connection to every peer, failing each Gloo wait in flight.
  void CloseConnections();
  // Runs on the collective thread before each collective; throws on a mismatch with a neighbour.
  void Handshake(absl::string_view kind, int64_t count, DType dtype);
  void RingReduceScatter(char* data, int64_t chunk_bytes, DType dtype);
  void RingAllGather(char* data, int64_t chunk_bytes);

  std::shared_ptr<gloo::Context> context_;
  const int64_t rank_;
  const int64_t world_size_;
  const GlooOptions options_;

  mutable Mutex mu_;
  std::deque<std::shared_ptr<Op>> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, int64_t> sent_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> received_ ABSL_GUARDED_BY(mu_);
  int64_t sequence_ = 0;  // collectives started; touched by the collective thread only
  std::thread thread_;
};

}  // namespace zerod::comm

#endif  // ZEROD_RUNTIME_COMM_GLOO_GLOO_COMMUNICATOR_H_
