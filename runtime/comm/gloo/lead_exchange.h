#ifndef ZEROD_RUNTIME_COMM_GLOO_LEAD_EXCHANGE_H_
#define ZEROD_RUNTIME_COMM_GLOO_LEAD_EXCHANGE_H_

// The first message of every Gloo collective: each rank's "lead" to its peers says which
// collective it is running (sequence number, kind, count, dtype, root), and for a small
// collective carries the data itself.
//
// Why: ranks that disagree on a collective must not reach Gloo with different sizes, because its
// TCP transport aborts the process when a message is longer than the receive posted for it. Leads
// travel on connections of their own (lead_mesh.h), one write and one read each, as frames of a
// bounded length that a peer reads whenever they come: a lead is sent at once (no rendezvous round
// trip), the check costs no message of its own, and a collective small enough to travel inline
// completes in a single exchange (an all-reduce whose chunks travel inline, in two).
//
// Peers: every other rank while the world has at most `all_to_all_max_world` ranks (leads may
// then carry data); beyond that only the two ring neighbours (header only: checking each rank
// against its predecessor checks the whole ring, and a rank's traffic stays O(1)).
//
// Who sends to whom (all-to-all leads): every rank to every other, except in a broadcast that goes
// inline or along the chain (RouteOf), where a rank that is not the root sends its lead to its
// ring successor only (the root's lead still goes to every rank). A rank waits for exactly the
// leads its view of the collective says are sent to it, its predecessor's first. Every rank always
// sends to its successor and checks its predecessor before anything else, so ranks that disagree
// are named at once by some rank whatever they disagree on (even on who the root is). An inline
// broadcast's data comes in the root's lead; a chain broadcast's from the predecessor, whose lead
// each receiver checked before posting its receive. A broadcast too large for the chain keeps
// every lead: Gloo's broadcast is a binomial tree, a rank's data comes from its tree parent, and
// only checking every rank's lead keeps a receive from being shorter than what arrives (Gloo
// aborts the process then). A sparse broadcast at 4 ranks sends 6 leads, not 12, and its root
// waits for one lead, not three: no barrier.
//
// Leads between two ranks arrive in order; a lead carries its sequence number, and one from
// another collective (a peer that sent one this rank's view did not expect) is named.
//
// Used by whichever thread runs the communicator's collectives (its collective thread, or a
// caller running a small one), one at a time. Every rank of a group must be given the same
// LeadOptions (a rank that is not is named at the first collective), and the inline limits
// (MaxInlineBytes), the chain's worlds and kMinTwoRankChainBytes,
// GlooCommunicator::kMaxOneExchangeExtraBytes, and how the communicator cuts Gloo's messages
// (kRingPieceBytes, kInPlaceRingBytes, kPackedRingBytes, kChainPieceBytes in
// gloo_communicator.cc: ranks that cut them otherwise make Gloo abort the process), and the
// shared-memory pieces (SharedMemoryMesh::kSlotBytes, kSlots) are part of the wire version
// (kMagic): changing any means a new magic.

#include <chrono>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/gloo/lead_mesh.h"
#include "runtime/common/dtype.h"

namespace zerod::comm::internal {

enum class CollectiveKind : int64_t {
  kAllReduce = 0,
  kReduceScatter = 1,
  kAllGather = 2,
  kBroadcast = 3,
  kBarrier = 4,
};

// What a rank is about to run. Two ranks agree on a collective when their descriptors are equal.
struct CollectiveDescriptor {
  int64_t sequence = 0;  // 1 for the communicator's first collective
  CollectiveKind kind = CollectiveKind::kBarrier;
  int64_t count = 0;
  DType dtype = DType::kFloat32;
  int64_t root = 0;  // broadcast only
  // A grouped reduce-scatter or all-gather (Communicator::ReduceScatterGroup): how many buffers,
  // and a digest of their chunk counts (`count` is their sum). 1 and 0 for one buffer.
  int64_t buffers = 1;
  uint64_t buffers_digest = 0;
  // A collective in two exchanges (an all-reduce whose reduce-scatter and all-gather each go
  // inline): 1 for the first, 2 for the second, which has the same sequence number; 0 for a
  // collective in one. Ranks that would take one exchange and two (given other limits) are named
  // as a mismatch, not by the size of what arrives.
  int64_t phase = 0;
};

// The digest of a group's chunk counts, in order, as CollectiveDescriptor::buffers_digest holds it.
uint64_t DigestOfCounts(const std::vector<int64_t>& counts);

// "#3 all_gather(bf16 x 20)" (or "... x 20 in 3 buffers"), as mismatch errors name a collective.
std::string Describe(const CollectiveDescriptor& d);
const char* KindName(CollectiveKind kind);

// Options every rank of a group must share; each lead carries the sender's, and a rank given
// others is named at the first collective.
struct LeadOptions {
  int64_t all_to_all_max_world = 16;
  int64_t split_all_reduce_max_bytes = 0;  // GlooOptions' (LeadExchange only checks it)
  int64_t shared_memory_min_bytes = 0;     // GlooOptions' (LeadExchange only checks it)
};

class LeadExchange {
 public:
  // The most data a lead carries to one peer beyond 4 ranks (MaxInlineBytes has every world's).
  static constexpr size_t kMaxInlineBytes = size_t{64} << 10;
  // The most a broadcast carries in its root's lead (to each other rank) in a world of
  // `world_size` ranks; more goes along the chain or Gloo's tree (RouteOf). At 2 ranks Gloo's
  // one message leaves only two one-way trips after the lead, while inline data follows the lead
  // in the same write; the limit stays under a loopback socket's default send buffer (4 MiB). At
  // 3 and 4 ranks the root writes an inline buffer once per rank, so the chain (each rank writes
  // it once) wins sooner. Why these sizes: docs/decisions/0013.
  static constexpr size_t kMaxInlineBroadcastBytes[] = {0, 0, size_t{2} << 20, size_t{256} << 10,
                                                        size_t{128} << 10};
  // The same for the other kinds (MaxInlineBytes), per peer: larger frames outgrow what the
  // sockets hold while every rank writes to every other (docs/decisions/0013).
  static constexpr size_t kMaxInlineOtherBytes[] = {0, 0, size_t{2} << 20, size_t{256} << 10,
                                                    size_t{256} << 10};
  // The most data a lead of `kind` carries to one peer in a world of `world_size` ranks (with
  // all-to-all leads). At 2 ranks every kind goes inline as far as a broadcast, for the same
  // reason (Gloo's messages leave two one-way trips after the lead).
  static constexpr size_t MaxInlineBytes(CollectiveKind kind, int64_t world_size) {
    if (world_size < 2 || world_size >= static_cast<int64_t>(std::size(kMaxInlineBroadcastBytes))) {
      return kMaxInlineBytes;
    }
    return kind == CollectiveKind::kBroadcast ? kMaxInlineBroadcastBytes[world_size]
                                              : kMaxInlineOtherBytes[world_size];
  }

  // The longest frame a lead takes on the mesh of a world of `world_size` ranks.
  static size_t MaxLeadBytes(int64_t world_size);
  // The ranks `rank` exchanges leads with, in rank order (see "Peers" above).
  static std::vector<int> PeersOf(int64_t rank, int64_t world_size, const LeadOptions& options);

  // `mesh` connects this rank to every other (null in a world of one); `shared_memory`: every rank
  // shares memory with every other (broadcasts may go through it: RouteOf).
  LeadExchange(std::unique_ptr<LeadMesh> mesh, int64_t rank, int64_t world_size,
               LeadOptions options, std::chrono::milliseconds timeout, bool shared_memory = false);
  ~LeadExchange();
  LeadExchange(const LeadExchange&) = delete;
  LeadExchange& operator=(const LeadExchange&) = delete;

  // Whether leads go to every other rank and may carry data.
  bool all_to_all() const { return all_to_all_; }
  // True when every message of a collective of `kind` moving `bytes_per_peer` to each peer fits
  // in a lead.
  bool CarriesInline(CollectiveKind kind, size_t bytes_per_peer) const {
    return all_to_all_ && bytes_per_peer <= MaxInlineBytes(kind, world_size_);
  }
  // How a broadcast of `bytes` travels: in the root's lead (up to MaxInlineBytes), along the ring
  // from the root (each rank forwards what its predecessor sent, in pieces), or through Gloo's
  // binomial tree. The first two have sparse leads (no barrier), so only with all-to-all leads (a
  // rank must hear from the root). The chain at 3-4 ranks, and at 2 ranks from
  // kMinTwoRankChainBytes, where the tree is Gloo's one message and the chain's pieces overlap
  // their hops; beyond 4 ranks a chain's hops would add up for buffers of a few pieces
  // (docs/decisions/0012). Where the ranks share memory (GlooCommunicator::UsesSharedMemory), a
  // broadcast of at least LeadOptions::shared_memory_min_bytes goes through it instead, with
  // sparse leads too (a receiver reads the root's segment only, and checked the root's lead).
  enum class BroadcastRoute { kInline, kChain, kTree, kSharedMemory };
  static constexpr int64_t kMinChainWorld = 2, kMaxChainWorld = 4;
  static constexpr size_t kMinTwoRankChainBytes = size_t{8} << 20;
  BroadcastRoute RouteOf(size_t bytes) const {
    return RouteOf(bytes, world_size_, all_to_all_,
                   shared_memory_ ? options_.shared_memory_min_bytes : -1);
  }
  // The same rule for a world of `world_size` ranks, with or without all-to-all leads, and
  // through shared memory from `shared_memory_min_bytes` if that is not negative (for
  // collective_bench, which has no LeadExchange).
  static BroadcastRoute RouteOf(size_t bytes, int64_t world_size, bool all_to_all,
                                int64_t shared_memory_min_bytes = -1) {
    if (!all_to_all) return BroadcastRoute::kTree;
    if (shared_memory_min_bytes >= 0 && bytes >= static_cast<size_t>(shared_memory_min_bytes)) {
      return BroadcastRoute::kSharedMemory;
    }
    if (bytes <= MaxInlineBytes(CollectiveKind::kBroadcast, world_size)) {
      return BroadcastRoute::kInline;
    }
    const bool chain = world_size >= kMinChainWorld && world_size <= kMaxChainWorld &&
                       (world_size > 2 || bytes >= kMinTwoRankChainBytes);
    return chain ? BroadcastRoute::kChain : BroadcastRoute::kTree;
  }
  // Ranks this rank exchanges leads with, ascending.
  const std::vector<int>& peers() const { return peers_; }

  // What goes inline to `peer` (nullptr/0 for a header-only lead). Only when all_to_all().
  using PayloadFor = std::function<std::pair<const void*, size_t>(int peer)>;

  // Sends this rank's lead for `mine` to the peers due one (see above), receives the lead of each
  // peer due to send one and checks it describes the same collective; throws std::runtime_error
  // naming both ranks and both collectives if not, or if the transport fails or the timeout
  // passes. Afterwards Payload(peer) holds what `peer` sent inline, until Release().
  void Exchange(const CollectiveDescriptor& mine, const PayloadFor& payload);
  // The data `peer` sent inline with its lead in the last Exchange, and its size (a peer whose
  // lead it waited for).
  std::pair<char*, size_t> Payload(int peer);
  // The last Exchange's payloads are no longer needed.
  void Release();
  // Closes the lead connections: a wait on a lead, now or next, fails here, and the peers' fail
  // at once. Any thread.
  void Close();
  // LeadMesh::SetSpin, for the collectives the calling thread runs next.
  void SetSpin(std::chrono::microseconds spin);
  // LeadMesh::waits (none at one rank, which has no mesh). Any thread.
  LeadMesh::Waits waits() const;

 private:
  struct Peer;
  // Whether rank `from` sends rank `to` a lead for `d`, in `d`'s view.
  bool Sends(int from, int to, const CollectiveDescriptor& d) const;
  // Waits for `p`'s lead of `mine` and checks it (throws as Exchange does).
  void Check(Peer& p, const CollectiveDescriptor& mine);
  // This rank's view of collective #sequence, if it is one of the last few (for error messages).
  const CollectiveDescriptor* Ran(int64_t sequence) const;

  std::unique_ptr<LeadMesh> mesh_;
  const int64_t rank_;
  const int64_t world_size_;
  const LeadOptions options_;
  const bool all_to_all_;
  const bool shared_memory_;
  const std::chrono::milliseconds timeout_;
  std::vector<int> peers_;
  std::vector<std::unique_ptr<Peer>> slots_;  // one per peer, in peers_ order
  std::vector<CollectiveDescriptor> ran_;     // the last collectives, by sequence modulo its size
  int64_t sequence_ = 0;                      // of the last Exchange
};

}  // namespace zerod::comm::internal

#endif  // ZEROD_RUNTIME_COMM_GLOO_LEAD_EXCHANGE_H_
