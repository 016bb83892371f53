#include "runtime/comm/gloo/lead_exchange.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace zerod::comm::internal {
namespace {

// How many of its last collectives a rank remembers, to name one a late lead describes.
constexpr size_t kRemembered = 8;

constexpr uint64_t kMagic = 0x416461654c646f72;  // "rodLeadA", a lead of this wire version

struct WireLead {
  uint64_t magic = kMagic;
  int64_t sequence = 0;
  int64_t kind = 0;
  int64_t count = 0;
  int64_t dtype = 0;
  int64_t root = 0;
  int64_t payload_bytes = 0;
  int64_t all_to_all_max_world = 0;  // the sender's options, which every rank must share
  int64_t split_all_reduce_max_bytes = 0;
  int64_t shared_memory_min_bytes = 0;
  int64_t buffers = 1;
  uint64_t buffers_digest = 0;
  int64_t phase = 0;
};

WireLead ToWire(const CollectiveDescriptor& d, size_t payload_bytes, const LeadOptions& options) {
  WireLead w;
  w.all_to_all_max_world = options.all_to_all_max_world;
  w.split_all_reduce_max_bytes = options.split_all_reduce_max_bytes;
  w.shared_memory_min_bytes = options.shared_memory_min_bytes;
  w.sequence = d.sequence;
  w.kind = static_cast<int64_t>(d.kind);
  w.count = d.count;
  w.dtype = static_cast<int64_t>(d.dtype);
  w.root = d.root;
  w.buffers = d.buffers;
  w.buffers_digest = d.buffers_digest;
  w.phase = d.phase;
  w.payload_bytes = static_cast<int64_t>(payload_bytes);
  return w;
}

bool SameCollective(const WireLead& a, const WireLead& b) {
  return a.sequence == b.sequence && a.kind == b.kind && a.count == b.count && a.dtype == b.dtype &&
         a.root == b.root && a.buffers == b.buffers && a.buffers_digest == b.buffers_digest &&
         a.phase == b.phase;
}

std::string DescribeWire(const WireLead& w) {
  if (w.kind < 0 || w.kind > static_cast<int64_t>(CollectiveKind::kBarrier) || w.dtype < 0 ||
      w.dtype > static_cast<int64_t>(DType::kFloat16)) {
    return absl::StrCat("#", w.sequence, " an unknown collective (kind ", w.kind, ", dtype ",
                        w.dtype, ")");
  }
  CollectiveDescriptor d;
  d.sequence = w.sequence;
  d.kind = static_cast<CollectiveKind>(w.kind);
  d.count = w.count;
  d.dtype = static_cast<DType>(w.dtype);
  d.root = w.root;
  d.buffers = w.buffers;
  d.buffers_digest = w.buffers_digest;
  d.phase = w.phase;
  return Describe(d);
}

}  // namespace

const char* KindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kBarrier:
      return "barrier";
  }
  return "collective";
}

std::string Describe(const CollectiveDescriptor& d) {
  std::string s = absl::StrCat("#", d.sequence, " ", KindName(d.kind), "(", DTypeName(d.dtype),
                               " x ", d.count, ")");
  if (d.buffers != 1) {
    s.pop_back();
    absl::StrAppend(&s, " in ", d.buffers, " buffers)");
  }
  if (d.kind == CollectiveKind::kBroadcast) absl::StrAppend(&s, " from rank ", d.root);
  if (d.phase != 0) absl::StrAppend(&s, ", exchange ", d.phase, " of 2");
  return s;
}

uint64_t DigestOfCounts(const std::vector<int64_t>& counts) {
  // FNV-1a over the counts: a group cut another way (same total) must not pass as the same.
  uint64_t h = 0xcbf29ce484222325;
  for (int64_t c : counts) {
    for (int i = 0; i < 8; ++i) {
      h ^= (static_cast<uint64_t>(c) >> (8 * i)) & 0xff;
      h *= 0x100000001b3;
    }
  }
  return h;
}

struct LeadExchange::Peer {
  int rank = 0;
  std::vector<char> lead;    // the last lead received, then its inline data
  bool holding = false;      // `lead` is this exchange's, until Release
  size_t payload_bytes = 0;  // of the lead held
};

size_t LeadExchange::MaxLeadBytes(int64_t world_size) {
  return sizeof(WireLead) + std::max(MaxInlineBytes(CollectiveKind::kAllReduce, world_size),
                                     MaxInlineBytes(CollectiveKind::kBroadcast, world_size));
}

std::vector<int> LeadExchange::PeersOf(int64_t rank, int64_t world_size,
                                       const LeadOptions& options) {
  std::vector<int> peers;
  if (world_size < 2) return peers;
  if (world_size <= options.all_to_all_max_world) {
    for (int64_t r = 0; r < world_size; ++r) {
      if (r != rank) peers.push_back(static_cast<int>(r));
    }
    return peers;
  }
  peers = {static_cast<int>((rank + world_size - 1) % world_size),
           static_cast<int>((rank + 1) % world_size)};
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

LeadExchange::LeadExchange(std::unique_ptr<LeadMesh> mesh, int64_t rank, int64_t world_size,
                           LeadOptions options, std::chrono::milliseconds timeout,
                           bool shared_memory)
    : mesh_(std::move(mesh)),
      rank_(rank),
      world_size_(world_size),
      options_(options),
      all_to_all_(world_size <= options.all_to_all_max_world),
      shared_memory_(shared_memory),
      timeout_(timeout),
      ran_(kRemembered) {
  peers_ = PeersOf(rank, world_size, options);
  for (int peer : peers_) {
    auto p = std::make_unique<Peer>();
    p->rank = peer;
    slots_.push_back(std::move(p));
  }
}

LeadExchange::~LeadExchange() = default;

void LeadExchange::Close() {
  if (mesh_ != nullptr) mesh_->Close();
}

void LeadExchange::SetSpin(std::chrono::microseconds spin) {
  if (mesh_ != nullptr) mesh_->SetSpin(spin);
}

LeadMesh::Waits LeadExchange::waits() const {
  return mesh_ != nullptr ? mesh_->waits() : LeadMesh::Waits{};
}

bool LeadExchange::Sends(int from, int to, const CollectiveDescriptor& d) const {
  // Only a broadcast that goes inline, along the chain or through shared memory is sparse: its data
  // comes in the root's lead, from the predecessor, or from the root's segment, whose leads every
  // receiver checks. A larger one goes through
  // Gloo's binomial tree, where a rank's data comes from its tree parent, whose lead a sparse
  // receiver would never see (a parent on another root's tree would send a longer message than
  // the receive posted, and Gloo aborts the process).
  if (!all_to_all_ || d.kind != CollectiveKind::kBroadcast || d.root < 0 || d.root >= world_size_ ||
      from == d.root || d.count < 0 ||
      RouteOf(static_cast<size_t>(d.count) * static_cast<size_t>(DTypeBytes(d.dtype))) ==
          BroadcastRoute::kTree) {
    return true;
  }
  return to == (from + 1) % world_size_;
}

const CollectiveDescriptor* LeadExchange::Ran(int64_t sequence) const {
  if (sequence < 1) return nullptr;
  const CollectiveDescriptor& d = ran_[static_cast<size_t>(sequence) % kRemembered];
  return d.sequence == sequence ? &d : nullptr;
}

void LeadExchange::Check(Peer& p, const CollectiveDescriptor& mine) {
  try {
    mesh_->Receive(p.rank, p.lead, timeout_);
  } catch (const std::exception& e) {
    throw std::runtime_error(absl::StrCat("the lead of ", Describe(mine), ": ", e.what()));
  }
  p.holding = true;
  const std::vector<char>& in = p.lead;
  WireLead theirs;
  if (in.size() < sizeof(theirs)) {
    throw std::runtime_error(
        absl::StrCat("rank ", p.rank, " sent a lead of ", in.size(), " bytes: not a zerod lead"));
  }
  std::memcpy(&theirs, in.data(), sizeof(theirs));
  if (theirs.magic != kMagic) {
    throw std::runtime_error(
        absl::StrCat("rank ", p.rank, " sent a lead of another zerod wire version"));
  }
  if (theirs.all_to_all_max_world != options_.all_to_all_max_world) {
    throw std::runtime_error(
        absl::StrCat("rank ", p.rank, " exchanges leads with every other rank up to worlds of ",
                     theirs.all_to_all_max_world, " ranks, rank ", rank_, " up to ",
                     options_.all_to_all_max_world,
                     ": every rank must be given the same GlooOptions::lead_all_to_all_max_world"));
  }
  if (theirs.split_all_reduce_max_bytes != options_.split_all_reduce_max_bytes) {
    throw std::runtime_error(absl::StrCat(
        "rank ", p.rank, " splits all-reduces up to ", theirs.split_all_reduce_max_bytes,
        " bytes, rank ", rank_, " up to ", options_.split_all_reduce_max_bytes,
        ": every rank must be given the same GlooOptions::split_all_reduce_max_bytes"));
  }
  if (theirs.shared_memory_min_bytes != options_.shared_memory_min_bytes) {
    throw std::runtime_error(
        absl::StrCat("rank ", p.rank, " moves collectives of ", theirs.shared_memory_min_bytes,
                     " bytes or more through shared memory, rank ", rank_, " of ",
                     options_.shared_memory_min_bytes,
                     ": every rank must be given the same GlooOptions::shared_memory_min_bytes"));
  }
  if (theirs.sequence < mine.sequence) {
    // A lead this rank's view of that collective did not expect from the peer.
    const CollectiveDescriptor* ran = Ran(theirs.sequence);
    throw std::runtime_error(
        absl::StrCat("collective mismatch: rank ", p.rank, " called ", DescribeWire(theirs),
                     " and sent rank ", rank_, " its lead, where rank ", rank_, " called ",
                     ran != nullptr ? Describe(*ran) : absl::StrCat("#", theirs.sequence),
                     " and expected none from it"));
  }
  if (theirs.sequence > mine.sequence) {
    throw std::runtime_error(absl::StrCat(
        "collective mismatch: rank ", rank_, " called ", Describe(mine), " and waits for rank ",
        p.rank, "'s lead, which sent none for it and went on to ", DescribeWire(theirs)));
  }
  if (!SameCollective(theirs, ToWire(mine, 0, options_))) {
    std::string theirs_described = DescribeWire(theirs);
    // Groups of as many buffers and elements, cut otherwise, read the same.
    if (theirs_described == Describe(mine)) theirs_described += " with its buffers cut otherwise";
    throw std::runtime_error(absl::StrCat("collective mismatch: rank ", rank_, " called ",
                                          Describe(mine), ", rank ", p.rank, " called ",
                                          theirs_described));
  }
  if (theirs.payload_bytes < 0 ||
      static_cast<size_t>(theirs.payload_bytes) != in.size() - sizeof(WireLead)) {
    throw std::runtime_error(absl::StrCat("rank ", p.rank, " sent a lead claiming ",
                                          theirs.payload_bytes, " bytes of data"));
  }
  p.payload_bytes = static_cast<size_t>(theirs.payload_bytes);
}

void LeadExchange::Exchange(const CollectiveDescriptor& mine, const PayloadFor& payload) {
  if (slots_.empty()) return;
  sequence_ = mine.sequence;
  ran_[static_cast<size_t>(mine.sequence) % kRemembered] = mine;
  const int me = static_cast<int>(rank_);
  std::string send_failed;
  for (auto& p : slots_) {
    if (!Sends(me, p->rank, mine)) continue;
    std::pair<const void*, size_t> data{nullptr, 0};
    if (payload) data = payload(p->rank);
    if (data.second > 0 && (!all_to_all_ || data.second > MaxInlineBytes(mine.kind, world_size_))) {
      throw std::logic_error(absl::StrCat("lead payload of ", data.second, " bytes does not fit (",
                                          Describe(mine), ")"));
    }
    const WireLead header = ToWire(mine, data.second, options_);
    try {
      mesh_->Send(p->rank, &header, sizeof(header), data.first, data.second);
    } catch (const std::exception& e) {
      // Most often a peer that found a mismatch and closed: the lead it sent first, checked
      // below, names it.
      if (send_failed.empty()) send_failed = e.what();
    }
  }
  // The predecessor's first: it sends to this rank whatever it runs, so ranks that disagree are
  // named even where a peer this rank waits for sends it nothing.
  const int predecessor = static_cast<int>((rank_ + world_size_ - 1) % world_size_);
  for (auto& p : slots_) {
    if (p->rank == predecessor) Check(*p, mine);
  }
  for (auto& p : slots_) {
    if (p->rank != predecessor && Sends(p->rank, me, mine)) Check(*p, mine);
  }
  if (!send_failed.empty()) {
    throw std::runtime_error(absl::StrCat("the lead of ", Describe(mine), ": ", send_failed));
  }
  // What the sockets did not take at once goes out before the collective ends (the job may end
  // with it); a peer two collectives behind may hold it up.
  try {
    mesh_->Flush(timeout_);
  } catch (const std::exception& e) {
    throw std::runtime_error(absl::StrCat("the lead of ", Describe(mine), ": ", e.what()));
  }
}

std::pair<char*, size_t> LeadExchange::Payload(int peer) {
  for (auto& p : slots_) {
    if (p->rank == peer && p->holding) {
      return {p->lead.data() + sizeof(WireLead), p->payload_bytes};
    }
  }
  throw std::logic_error(
      absl::StrCat("rank ", rank_, " holds no lead from rank ", peer, " (#", sequence_, ")"));
}

void LeadExchange::Release() {
  for (auto& p : slots_) p->holding = false;
}

}  // namespace zerod::comm::internal
