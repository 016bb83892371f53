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

struct GlooOptions {
  std::string hostname = "127.0.0.1";          // the address peers reach this rank at
  absl::Duration timeout = absl::Seconds(60);  // every collective and the rendezvous
  // Up to this world size leads go to every other rank and carry small collectives; above it
  // they go to the ring neighbours only (see lead_exchange.h).
  int64_t lead_all_to_all_max_world = 16;
  // An all-reduce too large to go inline and at most this large runs as this communicator's ring
  // reduce-scatter then all-gather; a larger one runs Gloo's ring all-reduce. Every rank must be
  // given the same value (the leads check it). Every size by default: collective_bench measured
  // the split as fast as Gloo's at 4 MiB and faster from 8 MiB up (0.67-0.99x at 2-4 ranks, three
  // alternating runs; docs/ARCHITECTURE.md, "The order check rides in each collective's first
  // message"); 0 turns it off.
  int64_t split_all_reduce_max_bytes = std::numeric_limits<int64_t>::max();
  // A collective that nobody started (Work::Start) or waited for runs on the collective thread
  // once it has been queued this long: a safety net where the engine starts what it issues to
  // overlap with its work, and what moves a started collective where background_start is off and
  // nobody waits for it yet (a layer that computes for longer than this still overlaps it). A
  // caller that waits at once runs its collective itself (GlooCommunicator::RunOrWait) without the
  // collective thread waking at all. Queueing sets that thread's timer to the due time and the
  // caller that empties the queue stops it. Waking the thread at every queueing instead (to set a
  // 200 us timeout of its own), or setting the timer that close, cost 4 KiB and 64 KiB
  // collectives at 3-4 ranks, where the processes share 2 cores, 1.2-2.0x their time
  // (collective_bench, three alternating runs): on the development VM a timer due before the
  // kernel's next tick costs 6 us to set and stop, against 0.9 us at 2 ms (build/bin/wakeup_bench,
  // three runs on 2026-12-07: 5.4-5.9 us at 200 us, 0.8-1.0 us at 2 ms, 0.4 us at 5 ms).
  absl::Duration unclaimed_grace = absl::Milliseconds(5);
  // How long a caller running a collective that travels on the lead connections alone (inline,
  // or an all-to-all barrier) polls them, yielding its CPU between polls, before it sleeps, from 0
  // to 1 s. Unset: 50 us (see caller_spin_). The collective thread, and collectives whose data
  // goes through Gloo, never spin.
  std::optional<absl::Duration> caller_spin;
  // Whether Work::Start has the collective thread run a collective at once, beside the caller's
  // work, rather than leaving it to the caller's Wait (and to unclaimed_grace). That thread
  // overlaps anything only on a CPU the trainers leave free; where they leave none it takes one
  // from a trainer, and the hand-offs between threads cost more than the overlap gives: on the
  // 2-core VM the demo's stage-3 step (4 ranks, 38K parameters) took 3.5-3.8 ms with it and
  // 2.5-2.8 ms without (2.4-2.7 ms at stage 0), and at 2 ranks 3.4-3.7 against 2.2 ms; the 2-rank
  // step of 1.07M parameters, whose layers compute for milliseconds, read the same either way
  // (docs/ARCHITECTURE.md, "A collective thread runs only on a CPU the trainers leave free").
  // Unset: on where this thread may use more CPUs (UsableCpus: its affinity, a cgroup quota) than
  // this communicator has ranks on its host (ranks with the same `hostname`).
  std::optional<bool> background_start;
  // Ranks that all run on one host move the data of all-reduces, reduce-scatters, all-gathers and
  // broadcasts whose buffers hold at least shared_memory_min_bytes (a rank's buffers together)
  // through shared memory (shared_memory_mesh.h) after their leads; smaller ones stay inline or on
  // the rings.
  // A rank created with shared_memory off turns it off for every rank
  // (GlooCommunicator::UsesSharedMemory says whether it is on). Every rank must be given the same
  // minimum (the leads check it); unset, the world's measured one
  // (GlooCommunicator::kSharedMemoryMinBytes).
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
  // size, where the ranks share memory and GlooOptions::shared_memory_min_bytes is unset.
  // collective_bench, two alternating runs, shared memory from 16 KiB against TCP (2026-12-07):
  // at 2 ranks it took 0.54-0.80x the time of the inline exchanges from 64 KiB (1.02-1.07x at
  // 16 KiB for a reduce-scatter or all-gather); at 3 ranks 0.47-0.73x from 256 KiB, 0.91-2.07x at
  // 64 KiB; at 4 ranks 0.76-1.03x at 256 KiB (a broadcast 0.22-0.35x), 0.21-0.79x from 1 MiB, and
  // 0.73-1.87x at 64 KiB. Waiting on peers that share 2 cores costs more the more ranks there are;
  // beyond 4 ranks (not measured) 4's is kept.
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

  // An all-reduce that fits in one inline exchange and in two (AllReduce) takes one while it sends
  // at most this many bytes more that way. collective_bench, three alternating runs, one exchange
  // against two: 0.5-0.7x at 2 ranks from 8 to 32 KiB and even at 64 KiB; at 3 ranks even up to
  // 32 KiB, 1.2x at 64 KiB; at 4 ranks even up to 16 KiB, 1.2-1.7x at 64 KiB. Beyond 4 ranks the
  // rule is extrapolated (not measured where more processes than 4 share 2 cores). Part of the
  // leads' wire version: ranks that choose differently are a mismatch (the lead's phase).
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
  // How long a caller running collectives polls its lead connections, yielding its CPU between
  // polls, before it sleeps: options_.caller_spin if set, else kCallerSpin. At 2 ranks on the
  // 2-core VM a 4 KiB all-reduce took 7 us with 50 us (or 200 us) of spinning against 56-57 us
  // without, where the loopback round trip is about 66 us. Where ranks outnumber CPUs a spin that
  // did not yield took the CPU from the peer it waited for (at 3 ranks 4-64 KiB all-reduces and
  // broadcasts took 1.7-3.5x as long with 50 us, 3.8-11x with 200 us), so it was off there; a spin
  // that yields took 0.5-0.7x the time of sleeping at 3 and 4 ranks (4 KiB all-reduce 35-36 us
  // against 52-62 at 3, 50-57 against 93-97 at 4; collective_bench, three alternating runs),
  // 200 us no better than 50.
  // Only for collectives on the lead connections alone: spinning on the leads of a 256 KiB
  // all-gather at 2 ranks, whose data then goes through Gloo, made it take 3.8-4.0 ms in three
  // runs of three against 0.17-0.18 ms, and a 256 KiB reduce-scatter 3.9 ms in one run of three
  // (Gloo's threads, which move its data, waited for the next scheduler tick).
  static constexpr std::chrono::microseconds kCallerSpin{50};
  const std::chrono::microseconds caller_spin_;
  // How far past its deadline a caller may be held by running a collective itself (when one that
  // ran ahead of it took Gloo's whole timeout). A caller that waits as long as the communicator's
  // timeout runs its collective itself though a small one ran first: handing it to the collective
  // thread cost a 4 KiB all-reduce at 2 ranks 15-19 us where it took 9-11 us.
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
