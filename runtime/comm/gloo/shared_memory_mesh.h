#ifndef ZEROD_RUNTIME_COMM_GLOO_SHARED_MEMORY_MESH_H_
#define ZEROD_RUNTIME_COMM_GLOO_SHARED_MEMORY_MESH_H_

// Shared memory between the ranks of a Gloo communicator that all run on one host, for the data
// of large reduce-scatters, all-gathers and all-reduces (their leads still go first, over TCP,
// and check that every rank runs the same collective).
//
// Why: on loopback every byte of a ring goes through the kernel twice (a copy into the socket, a
// copy out) with the TCP stack and a wake-up in between; a segment every rank maps moves it with
// plain copies (docs/decisions/0017).
//
// Layout: each rank owns a segment (a POSIX shared-memory object, mode 0600, named
// /zerod-<pid>-<random> and unlinked once every rank has answered whether it mapped it: from then
// on nothing outlives the processes; one killed during the rendezvous leaves its name): a header of
// counters, then two slots. A collective goes in pieces, one per slot in turn; a slot holds a
// region per rank. For piece k each rank
//   1. (reduce) copies its contribution to rank j's chunk into region j of its own slot, and
//      says so (`written`);
//   2. (reduce) waits until every rank has written, sums region `rank` of every rank's slot in
//      rank order (so every rank gets the same bits whatever the timing) into its own region, and
//      copies the sum to its chunk; (all-gather) copies its own chunk into its own region; says
//      so (`reduced`);
//   3. (gather) copies region j of rank j's slot, once j has said so, to its chunk j.
// Two slots are enough, with no wait to write one again: a rank says it wrote (or reduced) piece
// k + 1 only once it is done reading piece k, and goes past piece k + 1 only once every rank has
// said so. So no rank is ever more than one piece ahead of another, and piece k + 2, which takes
// piece k's slot, starts only once every rank is done with piece k.
// Every buffer is the rank's own: no peer writes into a caller's memory, so an aborted collective
// leaves nothing in flight towards it.
//
// Waiting: a rank polls a peer's counter, yielding its CPU between polls (ranks often outnumber
// CPUs), for kSpin; then sleeps on the peer's futex word, which a rank that publishes a counter
// wakes when someone sleeps on it. A sleep ends every kSleepSlice to look for a closed segment,
// a peer process that exited (pidfd, where the peer's pid is visible), and the timeout (one per
// collective). A peer that closed or exited after publishing what the wait needs (the end of a
// job) fails nothing.
//
// Who uses it: every rank or none. Connect maps every peer's segment; unless every rank mapped
// every other (ranks on other hosts, seeing another /dev/shm (containers), a full /dev/shm, a rank
// created with it off), all of them go without.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/comm/gloo/ring_parts.h"
#include "runtime/comm/store.h"
#include "runtime/common/dtype.h"

namespace zerod::comm::internal {

class SharedMemoryMesh {
 public:
  // A slot's bytes (a region per rank: kSlotBytes / world, in whole cache lines) and how many
  // slots a segment has (see "Two slots are enough"). Part of the leads' wire version: ranks must
  // cut pieces alike. kSlotBytes is the size that beat smaller and larger slots in collective_bench
  // (bench/RESULTS.md, "Figures moved from code comments").
  static constexpr size_t kSlotBytes = size_t{256} << 10;
  static constexpr uint64_t kSlots = 2;
  // How long a wait polls before it sleeps, and how long one sleep lasts at most.
  static constexpr std::chrono::microseconds kSpin{2000};
  static constexpr std::chrono::milliseconds kSleepSlice{10};

  // Maps this rank's segment and every peer's, publishing under `key_prefix` in `store`. OK and
  // null when some rank could not map every other's, or was created with `enabled` false; an
  // error only when the store fails (or times out).
  static absl::StatusOr<std::unique_ptr<SharedMemoryMesh>> Connect(Store& store,
                                                                   const std::string& key_prefix,
                                                                   int64_t rank, int64_t world,
                                                                   bool enabled,
                                                                   absl::Duration timeout);
  ~SharedMemoryMesh();
  SharedMemoryMesh(const SharedMemoryMesh&) = delete;
  SharedMemoryMesh& operator=(const SharedMemoryMesh&) = delete;

  // After it chunk `rank` of every part holds the sum over ranks of theirs (summed in rank order;
  // bf16 and fp16 round after every addition); with `then_all_gather`, every chunk does (an
  // all-reduce). Throws std::runtime_error naming the rank waited for when a peer closed its
  // segment or exited, the timeout passed on one wait, or Close() was called.
  void ReduceScatter(const std::vector<RingPart>& parts, DType dtype, bool then_all_gather,
                     std::chrono::milliseconds timeout);
  // After it every rank's chunk `rank` of every part is in every rank's parts. Throws as above.
  void AllGather(const std::vector<RingPart>& parts, std::chrono::milliseconds timeout);
  // After it every rank's `bytes` at `data` are `root`'s: the root copies each piece (a whole
  // slot) into its segment, the others copy it out. Throws as above.
  void Broadcast(char* data, size_t bytes, int64_t root, std::chrono::milliseconds timeout);
  // Pieces this rank has run so far (every collective's together). Any thread.
  int64_t pieces_run() const { return pieces_run_.load(std::memory_order_relaxed); }
  // Marks this rank's segment closed and wakes every wait on it, here and at the peers: theirs
  // fail naming this rank. Any thread, any number of times.
  void Close();

  // The start of a segment: who owns it, and its counters (defined in the .cc).
  struct Header;

 private:
  struct Segment {
    char* base = nullptr;
    size_t bytes = 0;
    int pidfd = -1;  // the owner's process, where its pid is visible here
  };
  enum class Mode { kReduceScatter, kAllReduce, kAllGather };

  SharedMemoryMesh(int64_t rank, int64_t world, std::vector<Segment> segments);
  Header& HeaderOf(int64_t rank) const;
  char* Region(int64_t rank, uint64_t piece, int64_t region) const;
  void Run(const std::vector<RingPart>& parts, DType dtype, Mode mode,
           std::chrono::milliseconds timeout);
  // Sums region `rank_` of piece `piece` over every rank's slot into this rank's, in rank order;
  // this rank's own term comes from its parts.
  void SumRegion(const std::vector<RingPart>& parts, DType dtype, uint64_t piece, size_t begin,
                 size_t bytes);
  // Sets this rank's counter to `value` and wakes whoever sleeps on its segment.
  void Publish(std::atomic<uint64_t> Header::*counter, uint64_t value);
  // Which piece of the collective running a wait is for, for its errors.
  struct PieceOf {
    size_t index, count;
  };
  // Waits until `peer`'s counter reaches `value`; throws naming the peer and the piece when it
  // cannot (PeerProblem) or the deadline passes.
  void Await(int64_t peer, std::atomic<uint64_t> Header::*counter, uint64_t value,
             const PieceOf& at, std::chrono::steady_clock::time_point deadline);
  // Why `peer` will not publish more: this rank's segment or any rank's is closed, or `peer`'s
  // process exited.
  std::optional<std::string> PeerProblem(int64_t peer, const PieceOf& at) const;
  static std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::milliseconds timeout);
  // The number of the piece this rank runs next (pieces_, counted in pieces_run_ too).
  uint64_t NextPiece();

  const int64_t rank_;
  const int64_t world_;
  const size_t region_bytes_;  // kSlotBytes / world in whole cache lines
  std::vector<Segment> segments_;
  uint64_t pieces_ = 0;                 // pieces run so far; by the thread running a collective
  std::atomic<int64_t> pieces_run_{0};  // the same, for pieces_run() from any thread
};

}  // namespace zerod::comm::internal

#endif  // ZEROD_RUNTIME_COMM_GLOO_SHARED_MEMORY_MESH_H_
