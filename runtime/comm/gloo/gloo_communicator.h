#ifndef ZEROD_RUNTIME_COMM_GLOO_GLOO_COMMUNICATOR_H_
#define ZEROD_RUNTIME_COMM_GLOO_GLOO_COMMUNICATOR_H_

// The Communicator on Gloo's TCP transport, for host memory.
//
// Rendezvous goes through a comm::Store (the coordinator's in real runs). Every collective starts
// with a lead to the rank's peers (lead_exchange.h) that checks all ranks run the same collective.
// Small collectives travel inside the leads: one exchange, with sums added in rank order so every
// rank gets the same bits; an all-reduce whose chunks fit in a lead, in two (reduce-scatter, then
// all-gather). Larger ones then run our rings over Gloo's pairwise buffers (reduce-scatter,
// all-gather, and an all-reduce as both: Gloo's new API has no reduce-scatter), a chain broadcast
// over them, or Gloo's algorithms (a tree broadcast; the all-reduce if configured; a barrier of
// neighbour leads). A reduce-scatter or all-gather sends exactly (world - 1) x chunk bytes per
// rank, as the planner counts; an all-reduce in one exchange (world - 1) x its bytes, in two or
// along the rings 2 (world - 1) / world of them, give or take the uneven last chunk.
//
// Owns one thread that runs the collectives in call order (a Gloo context is not thread-safe); a
// caller that waits for the collective next in line runs it itself. The destructor
// aborts what is queued and joins the thread.
//
// Abort (and a collective that fails) closes every connection first: the collective in flight
// fails at once on this rank and, through the closed connections, on its peers; no transfer can
// land in its buffers afterwards, and its Work reports the failure only once Gloo has let go of
// them. Creating one ignores SIGPIPE in the process if nothing handles it (Gloo's writes raise
// it on a connection the peer closed).

#include <gloo/transport/unbound_buffer.h>

#include <chrono>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/gloo/chunks.h"
#include "runtime/comm/gloo/lead_exchange.h"
#include "runtime/comm/gloo/ring_parts.h"
#include "runtime/comm/gloo/shared_memory_mesh.h"
#include "runtime/comm/store.h"
#include "runtime/common/mutex.h"

namespace gloo {
class Context;
}

namespace zerod::comm {

// Every rank of a communicator must be given the same lead_all_to_all_max_world,
// split_all_reduce_max_bytes and shared_memory_min_bytes: the leads carry them and name a rank that
// differs. The rest may differ between ranks. Why each default is what it is: docs/decisions/.
struct GlooOptions {
  std::string hostname = "127.0.0.1";          // the address peers reach this rank at
  absl::Duration timeout = absl::Seconds(60);  // every collective and the rendezvous
  // Up to this world size leads go to every other rank and carry small collectives; above it
  // they go to the ring neighbours only (see lead_exchange.h).
  int64_t lead_all_to_all_max_world = 16;
  // An all-reduce too large to go inline and at most this many bytes runs as this communicator's
  // ring reduce-scatter then all-gather; a larger one as Gloo's ring all-reduce. 0: always Gloo's.
  // Default: every size (docs/decisions/0007).
  int64_t split_all_reduce_max_bytes = std::numeric_limits<int64_t>::max();
  // How long a queued collective that nobody started (Work::Start) or waits for yet may wait for
  // a caller to run it (RunOrWait) before the collective thread runs it, 0 to 24 h. A safety net
  // for overlapped collectives; collectives waited for at once never wake that thread. Far enough
  // ahead that arming the thread's timer stays cheap (docs/decisions/0015).
  absl::Duration unclaimed_grace = absl::Milliseconds(5);
  // How long a caller running a collective that travels on the lead connections alone (inline, or
  // an all-to-all barrier) polls them, yielding its CPU between polls, before it sleeps, 0 to 1 s.
  // Unset: kCallerSpin. The collective thread, and collectives whose data goes through Gloo, never
  // spin (docs/decisions/0016).
  std::optional<absl::Duration> caller_spin;
  // Whether Work::Start has the collective thread run a collective at once, beside the caller's
  // work, rather than leaving it to the caller's Wait (and to unclaimed_grace). That overlaps only
  // on a CPU the trainers leave free. Unset: on where this thread may use more CPUs (UsableCpus:
  // affinity, cgroup quota) than this communicator has ranks on its host (same `hostname`)
  // (docs/decisions/0021).
  std::optional<bool> background_start;
  // Ranks that all run on one host move the data of all-reduces, reduce-scatters, all-gathers and
  // broadcasts whose buffers (a rank's together) hold at least shared_memory_min_bytes through
  // shared memory (shared_memory_mesh.h) after their leads; smaller ones stay inline or on the
  // rings. A rank created with shared_memory off turns it off for every rank (UsesSharedMemory
  // says whether it is on). Unset minimum: kSharedMemoryMinBytes for the world size.
  bool shared_memory = true;
  std::optional<int64_t> shared_memory_min_bytes;
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
  // One collective: one lead naming the group, then every buffer inline in it (when their chunks
  // together fit) or every buffer's ring transfers of a step in flight at once.
  std::unique_ptr<Work> ReduceScatterGroup(const std::vector<ChunkedBuffer>& buffers,
                                           DType dtype) override;
  std::unique_ptr<Work> AllGatherGroup(const std::vector<ChunkedBuffer>& buffers,
                                       DType dtype) override;
  std::unique_ptr<Work> Broadcast(void* data, int64_t count, DType dtype, int64_t root) override;
  std::unique_ptr<Work> Barrier() override;
  void Abort(const absl::Status& why) override;

  // One buffer of a ring collective: its world chunks.
  using RingPart = internal::RingPart;
  std::map<std::string, int64_t> BytesSent() const override;
  std::map<std::string, int64_t> BytesReceived() const override;
  // This rank's rounds of waiting on its lead connections so far that spun
  // (GlooOptions::caller_spin) and that slept (LeadMesh::Waits). Any thread; for tests and
  // collective_bench.
  internal::LeadMesh::Waits LeadWaits() const { return leads_.waits(); }
  // Whether Work::Start runs a collective on the collective thread at once
  // (GlooOptions::background_start, or what Create chose for it).
  bool StartsInBackground() const { return background_start_; }
  // Whether every rank mapped every other's shared memory at Create (GlooOptions::shared_memory).
  bool UsesSharedMemory() const { return shm_ != nullptr; }
  // Pieces of collectives this rank has moved through shared memory so far (0 without it). Any
  // thread; for tests and train_mlp's summary.
  int64_t SharedMemoryPieces() const { return shm_ != nullptr ? shm_->pieces_run() : 0; }
  // The smallest buffers (a rank's together; a broadcast's) that go through shared memory, by world
  // size, where the ranks share memory and GlooOptions::shared_memory_min_bytes is unset: where
  // shared memory beat the inline exchanges and rings in collective_bench (bench/RESULTS.md,
  // "Figures moved from code comments"). Worlds beyond the table use its last entry.
  static constexpr int64_t kSharedMemoryMinBytes[] = {0, 0, int64_t{64} << 10, int64_t{256} << 10,
                                                      int64_t{256} << 10};
  // GlooOptions::shared_memory_min_bytes if set, else the table's for `world_size`.
  static int64_t SharedMemoryMinBytes(const GlooOptions& options, int64_t world_size);

  struct Op;
  // For this communicator's Works: runs `op`, and those queued before it, on the calling thread
  // while the caller has Gloo's timeout left to wait, else has the collective thread run them at
  // once; then waits for it.
  absl::Status RunOrWait(const std::shared_ptr<Op>& op, absl::Duration timeout)
      ABSL_LOCKS_EXCLUDED(mu_);
  // For Work::Start: has the collective thread run `op`, and those queued before it, at once.
  void StartInBackground(const std::shared_ptr<Op>& op) ABSL_LOCKS_EXCLUDED(mu_);

  // An all-reduce that fits in one inline exchange and in two (AllReduce) takes one while that
  // sends at most this many bytes more than two would ((world - 2) x its bytes; always at 2 ranks).
  // Part of the leads' wire version: ranks that choose differently are a mismatch (the lead's
  // phase). Why: docs/decisions/0008.
  static constexpr size_t kMaxOneExchangeExtraBytes = size_t{32} << 10;
  // How an all-reduce of `count` elements travels among `world_size` ranks given `options`: in one
  // inline exchange, in two (an inline reduce-scatter, then an inline all-gather), along our rings,
  // or through Gloo's ring all-reduce. Static for collective_bench, which reports the route.
  // `shared_memory`: whether the ranks share memory (UsesSharedMemory).
  enum class AllReduceRoute { kSharedMemory, kOneExchange, kTwoExchanges, kRings, kGloo };
  static AllReduceRoute AllReduceRouteOf(int64_t count, DType dtype, int64_t world_size,
                                         const GlooOptions& options, bool shared_memory);

 private:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, std::unique_ptr<internal::LeadMesh> mesh,
                   std::unique_ptr<internal::SharedMemoryMesh> shm, bool background_start,
                   int64_t rank, int64_t world_size, GlooOptions options);
  // Whether a collective over buffers of `bytes` (this rank's together) goes through shared memory.
  bool ViaSharedMemory(int64_t bytes) const {
    return shm_ != nullptr && bytes >= SharedMemoryMinBytes(options_, world_size_);
  }
  // `leads_only`: the collective travels on the lead connections alone (inline, or an all-to-all
  // barrier), so a caller running it may spin on them (caller_spin_).
  std::unique_ptr<Work> Enqueue(std::string name, int64_t sent, int64_t received, bool leads_only,
                                std::function<void()> body);
  // The collective thread: runs, in order, what no caller took within options_.unclaimed_grace of
  // queueing it (a collective issued to overlap with work and waited for later).
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Has the collective thread look at the queue by `at` (at once if that has passed): sets its
  // timer unless it is set to fire by then already.
  void WakeLoopBy(std::chrono::steady_clock::time_point at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // When the collective thread is to run queued `op`: at once once a caller wanted it run there
  // (or the communicator is stopping), else when its grace (unclaimed_grace_) runs out.
  std::chrono::steady_clock::time_point DueAt(const Op& op) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the collective thread's timer: nothing is queued for it to look at.
  void DisarmLoop() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Pops the first queued collective and runs it, with mu_ released meanwhile.
  // `on_callers_thread`: by a caller in RunOrWait, whose lead waits spin first (caller_spin_).
  void RunFront(bool on_callers_thread) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the connection to every peer, failing each Gloo wait in flight.
  void CloseConnections();
  // The descriptor of the next collective (by the thread running it).
  internal::CollectiveDescriptor Next(internal::CollectiveKind kind, int64_t count, DType dtype,
                                      int64_t root = 0);
  // ... of a grouped one, over buffers of `counts` chunk elements (`total` together).
  internal::CollectiveDescriptor NextGroup(internal::CollectiveKind kind,
                                           const std::vector<int64_t>& counts, int64_t total,
                                           DType dtype);
  // A grouped reduce-scatter or all-gather: its lead, then `body` with the lead still to exchange
  // when the data goes inline in it (the body exchanges and releases it), or nullopt when the
  // leads were exchanged and the data goes round the rings. Parts are the non-empty buffers.
  using GroupBody = std::function<void(const std::optional<internal::CollectiveDescriptor>&,
                                       const std::vector<RingPart>&, size_t peer_bytes)>;
  std::unique_ptr<Work> EnqueueGroup(const char* name, internal::CollectiveKind kind,
                                     const std::vector<ChunkedBuffer>& buffers, DType dtype,
                                     GroupBody body);
  // What `peer` sent inline with its lead; throws unless it is `bytes` long.
  const char* InlinePayload(int peer, size_t bytes);
  // out = the sum over ranks of their inline contributions (`mine` for this rank), in rank order;
  // each peer's is `at` bytes into its payload of `payload_bytes`.
  void SumInRankOrder(char* out, const char* mine, int64_t count, DType dtype, size_t at,
                      size_t payload_bytes);
  // Rings over the world chunks of `data` (chunks.h): reduce-scatter leaves rank r's chunk holding
  // the sum of every rank's, all-gather sends each rank's chunk to every other.
  // A ring's buffers, which Abort wakes while they are registered (Gloo does not wake a wait on a
  // pair it closed): registered for the object's lifetime; the constructor throws when the
  // communicator was aborted already.
  class WatchedBuffers;
  // A group's parts go round in a few rings: those with large chunks together, each in messages
  // of its own from its buffer; small ones packed end to end, up to 16 MiB a step in a ring.
  void RingReduceScatter(const std::vector<RingPart>& parts, DType dtype);
  void RingAllGather(const std::vector<RingPart>& parts);
  // One ring of small parts, each step's chunks packed into staging and sent in pieces, each
  // summed into its parts while the next one arrives.
  void RingReduceScatterPacked(const std::vector<RingPart>& parts, DType dtype);
  // One ring of parts sent from their buffers in pieces, each summed while the next one arrives;
  // with `then_all_gather`, the all-gather ring after it (an all-reduce), its first step
  // overlapping the reduce-scatter's last.
  void RingReduceScatterInPieces(const std::vector<RingPart>& parts, DType dtype,
                                 bool then_all_gather = false);
  void RingAllGatherOnce(const std::vector<RingPart>& parts);
  // An all-reduce whose chunks go inline: a reduce-scatter in `lead`'s exchange, then an
  // all-gather in a second one (`lead` has phase 1, the second phase 2).
  void TwoExchangeAllReduce(const internal::CollectiveDescriptor& lead, char* own,
                            const internal::Chunks& chunks, DType dtype);
  // A broadcast of `bytes` at `data` from `root` along the ring: each rank receives it from its
  // predecessor and forwards it to its successor, piece by piece.
  void ChainBroadcast(char* data, size_t bytes, int64_t root);
  // An all-gather of parts each received into place, as messages of their own (1 MiB pieces)
  // all in flight.
  void RingAllGatherInPlace(const std::vector<RingPart>& parts);
  // Frees staging buffers grown beyond what is kept between collectives.
  void TrimStaging();
  // The parts of a group's non-empty buffers.
  std::vector<RingPart> RingParts(const std::vector<ChunkedBuffer>& buffers, DType dtype) const;
  // Staging buffer `which` (0 or 1) of at least `bytes`, for the running collective.
  char* Staging(int which, size_t bytes);
  // Chunk `chunk` of every part, end to end: in place for one part, else packed into slot
  // `slot_in_staging` of world slots of staging buffer 0 (an inline group's payload for a peer).
  const char* Packed(const std::vector<RingPart>& parts, int64_t chunk, int64_t slot_in_staging);

  std::shared_ptr<gloo::Context> context_;
  const int64_t rank_;
  const int64_t world_size_;
  const GlooOptions options_;
  internal::LeadExchange leads_;  // by the thread running a collective (executing_)
  // Null unless every rank shares memory with every other; used as leads_ is.
  const std::unique_ptr<internal::SharedMemoryMesh> shm_;
  const bool background_start_;

  mutable Mutex mu_;
  std::deque<std::shared_ptr<Op>> queue_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<gloo::transport::UnboundBuffer*> watched_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // A thread (the collective thread, or a caller in RunOrWait) is running a collective: one at a
  // time, in call order, as a Gloo context requires.
  bool executing_ ABSL_GUARDED_BY(mu_) = false;
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;  // collectives queued so far (an Op's index)
  // Collectives up to this index are waited for by callers that do not run them: the collective
  // thread runs them without waiting for a caller (unclaimed_grace_).
  int64_t wanted_through_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> sent_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> received_ ABSL_GUARDED_BY(mu_);
  int64_t sequence_ = 0;          // collectives started; by the thread running a collective
  std::vector<char> staging_[2];  // Staging(); by the thread running a collective

  // options_.unclaimed_grace, on the queue's clock.
  const std::chrono::steady_clock::duration unclaimed_grace_;
  // How long a caller running collectives on the lead connections alone polls them, yielding its
  // CPU between polls, before it sleeps: options_.caller_spin if set, else kCallerSpin. A peer's
  // lead often comes sooner than a sleeping thread wakes; the yield lets a peer that shares the
  // CPU send it. Not for collectives whose data goes through Gloo: spinning there holds back
  // Gloo's own threads (docs/decisions/0016).
  static constexpr std::chrono::microseconds kCallerSpin{50};
  const std::chrono::microseconds caller_spin_;
  // How far past its deadline a caller may be held by running a collective itself (when one that
  // ran ahead of it took Gloo's whole timeout). A caller that waits as long as the communicator's
  // timeout runs its collective itself though a small one ran first: handing it to the collective
  // thread instead costs a thread wake-up (docs/decisions/0015).
  static constexpr absl::Duration kCallerOverrun = absl::Milliseconds(100);
  // The collective thread sleeps reading this timerfd (CLOCK_MONOTONIC, steady_clock's clock),
  // apart from mu_ so that its releases do not wake it; set under mu_.
  const int loop_timer_fd_;
  // When the timer is set to fire, while it is (its last firing not yet looked at counts too).
  std::optional<std::chrono::steady_clock::time_point> loop_due_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace zerod::comm

#endif  // ZEROD_RUNTIME_COMM_GLOO_GLOO_COMMUNICATOR_H_
