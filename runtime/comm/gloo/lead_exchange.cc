#include "runtime/comm/gloo/lead_exchange.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace zerod::comm::internal {
namespace {

// Leads travel on a slot of their own, above any Gloo's own algorithms take (Context::nextSlot
// counts up from 0 in an int). Gloo matches the messages of one slot between two ranks with the
// receives posted for them in order, so each direction is a queue.
constexpr uint64_t kLeadSlot = uint64_t{1} << 62;

// How many of its last collectives a rank remembers, to name one a late lead describes.
constexpr size_t kRemembered = 8;

constexpr uint64_t kMagic = 0x346461654c646f72;  // "rodLead4", a lead of this wire version

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
  int64_t buffers = 1;
  uint64_t buffers_digest = 0;
};

WireLead ToWire(const CollectiveDescriptor& d, size_t payload_bytes, const LeadOptions& options) {
  WireLead w;
  w.all_to_all_max_world = options.all_to_all_max_world;
  w.split_all_reduce_max_bytes = options.split_all_reduce_max_bytes;
  w.sequence = d.sequence;
  w.kind = static_cast<int64_t>(d.kind);
  w.count = d.count;
  w.dtype = static_cast<int64_t>(d.dtype);
  w.root = d.root;
  w.buffers = d.buffers;
  w.buffers_digest = d.buffers_digest;
  w.payload_bytes = static_cast<int64_t>(payload_bytes);
  return w;
}

bool SameCollective(const WireLead& a, const WireLead& b) {
  return a.sequence == b.sequence && a.kind == b.kind && a.count == b.count && a.dtype == b.dtype &&
         a.root == b.root && a.buffers == b.buffers && a.buffers_digest == b.buffers_digest;
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
  // Two receives posted, taken in turn: in[head] gets the next lead from this peer. Two sends,
  // by the parity of the collective's sequence, so that a send not yet waited for (to a peer
  // that sends nothing back) can still be in flight while the next lead goes out.
  std::vector<char> in[2];  // the lead received, then its inline data
  std::vector<char> out[2];
  std::unique_ptr<gloo::transport::UnboundBuffer> in_buffer[2];
  std::unique_ptr<gloo::transport::UnboundBuffer> out_buffer[2];
  int head = 0;
  bool holding = false;      // in[head] holds this exchange's lead, until Release
  int sends[2] = {0, 0};     // sends issued from `out` and not yet waited for
  size_t payload_bytes = 0;  // of the lead held
};

LeadExchange::LeadExchange(std::shared_ptr<gloo::Context> context, int64_t rank, int64_t world_size,
                           LeadOptions options, std::chrono::milliseconds timeout)
    : context_(std::move(context)),
      rank_(rank),
      world_size_(world_size),
      options_(options),
      all_to_all_(world_size <= options.all_to_all_max_world),
      timeout_(timeout),
      ran_(kRemembered) {
  if (world_size < 2) return;
  if (all_to_all_) {
    for (int64_t r = 0; r < world_size; ++r) {
      if (r != rank) peers_.push_back(static_cast<int>(r));
    }
  } else {
    peers_ = {static_cast<int>((rank + world_size - 1) % world_size),
              static_cast<int>((rank + 1) % world_size)};
    std::sort(peers_.begin(), peers_.end());
    peers_.erase(std::unique(peers_.begin(), peers_.end()), peers_.end());
  }
  // One capacity whatever the options, so that even a rank given other options (or a lead with
  // data sent to a rank that expects none) cannot overrun a receive: the difference is named.
  const size_t capacity = sizeof(WireLead) + kMaxInlineBytes;
  for (int peer : peers_) {
    auto p = std::make_unique<Peer>();
    p->rank = peer;
    for (int i = 0; i < 2; ++i) {
      p->in[i].resize(capacity);
      p->out[i].resize(capacity);
      p->in_buffer[i] = context_->createUnboundBuffer(p->in[i].data(), p->in[i].size());
      p->out_buffer[i] = context_->createUnboundBuffer(p->out[i].data(), p->out[i].size());
    }
    // Posted now, so that even the first collective's leads go out at once.
    Post(*p, 0);
    Post(*p, 1);
    slots_.push_back(std::move(p));
  }
}

// The owner closes the transport first (GlooCommunicator aborts before it destroys this), so no
// lead can land in a receive still posted.
LeadExchange::~LeadExchange() = default;

void LeadExchange::Post(Peer& p, int slot) {
  p.in_buffer[slot]->recv(p.rank, kLeadSlot, 0, p.in[slot].size());
}

bool LeadExchange::Sends(int from, int to, const CollectiveDescriptor& d) const {
  if (!all_to_all_ || d.kind != CollectiveKind::kBroadcast || d.root < 0 || d.root >= world_size_ ||
      from == d.root) {
    return true;
  }
  return to == (from + 1) % world_size_;
}

const CollectiveDescriptor* LeadExchange::Ran(int64_t sequence) const {
  if (sequence < 1) return nullptr;
  const CollectiveDescriptor& d = ran_[static_cast<size_t>(sequence) % kRemembered];
  return d.sequence == sequence ? &d : nullptr;
}

void LeadExchange::AbortWaits() {
  for (auto& p : slots_) {
    for (int i = 0; i < 2; ++i) {
      p->out_buffer[i]->abortWaitSend();
      p->in_buffer[i]->abortWaitRecv();
    }
  }
}

void LeadExchange::WaitSends(Peer& p, int parity, const CollectiveDescriptor& of) {
  for (; p.sends[parity] > 0; --p.sends[parity]) {
    if (!p.out_buffer[parity]->waitSend(timeout_)) {
      throw std::runtime_error(
          absl::StrCat("the lead of ", Describe(of), " to rank ", p.rank, " was aborted"));
    }
  }
}

void LeadExchange::Check(Peer& p, const CollectiveDescriptor& mine) {
  if (!p.in_buffer[p.head]->waitRecv(timeout_)) {
    throw std::runtime_error(
        absl::StrCat("the lead of ", Describe(mine), " from rank ", p.rank, " was aborted"));
  }
  p.holding = true;  // taken: Release posts its receive again
  const std::vector<char>& in = p.in[p.head];
  WireLead theirs;
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
      static_cast<size_t>(theirs.payload_bytes) > in.size() - sizeof(WireLead)) {
    throw std::runtime_error(absl::StrCat("rank ", p.rank, " sent a lead claiming ",
                                          theirs.payload_bytes, " bytes of data"));
  }
  p.payload_bytes = static_cast<size_t>(theirs.payload_bytes);
}

void LeadExchange::Exchange(const CollectiveDescriptor& mine, const PayloadFor& payload) {
  if (slots_.empty()) return;
  if (!broken_why_.empty()) {
    throw std::runtime_error(
        absl::StrCat("the connections broke after collective #", broken_after_, ": ", broken_why_));
  }
  sequence_ = mine.sequence;
  ran_[static_cast<size_t>(mine.sequence) % kRemembered] = mine;
  const int parity = static_cast<int>(mine.sequence & 1);
  const int me = static_cast<int>(rank_);
  // A payload that goes to several peers is copied once and sent from the same buffer.
  Peer* last_sender = nullptr;
  std::pair<const void*, size_t> last_payload{nullptr, 0};
  for (auto& p : slots_) {
    if (!Sends(me, p->rank, mine)) continue;
    std::pair<const void*, size_t> data{nullptr, 0};
    if (payload) data = payload(p->rank);
    if (data.second > 0 && (!all_to_all_ || data.second > kMaxInlineBytes)) {
      throw std::logic_error(absl::StrCat("lead payload of ", data.second, " bytes does not fit (",
                                          Describe(mine), ")"));
    }
    Peer* sender = p.get();
    if (last_sender != nullptr && data == last_payload) {
      sender = last_sender;
    } else {
      const WireLead header = ToWire(mine, data.second, options_);
      std::memcpy(sender->out[parity].data(), &header, sizeof(header));
      if (data.second > 0) {
        std::memcpy(sender->out[parity].data() + sizeof(header), data.first, data.second);
      }
      last_sender = sender;
      last_payload = data;
    }
    sender->out_buffer[parity]->send(p->rank, kLeadSlot, 0, sizeof(WireLead) + data.second);
    ++sender->sends[parity];
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
  // A peer waited for had posted its receives before it sent its lead, so these complete at
  // once; and a root's sends to the ranks it did not wait for go out before the collective ends
  // (the job may end with it), unless such a rank is two collectives behind.
  for (auto& p : slots_) WaitSends(*p, parity, mine);
}

std::pair<char*, size_t> LeadExchange::Payload(int peer) {
  for (auto& p : slots_) {
    if (p->rank == peer && p->holding) {
      return {p->in[p->head].data() + sizeof(WireLead), p->payload_bytes};
    }
  }
  throw std::logic_error(
      absl::StrCat("rank ", rank_, " holds no lead from rank ", peer, " (#", sequence_, ")"));
}

void LeadExchange::Release() {
  // The collective that just ended is complete whatever happens here: a peer that finished first
  // may have closed its connections already (its communicator destroyed at the end of a job),
  // and posting a receive on them throws. The next collective reports that, if there is one.
  for (auto& p : slots_) {
    if (!p->holding) continue;
    p->holding = false;
    const int taken = p->head;
    p->head ^= 1;
    if (!broken_why_.empty()) continue;
    try {
      Post(*p, taken);
    } catch (const std::exception& e) {
      broken_after_ = sequence_;
      broken_why_ = e.what();
    }
  }
}

}  // namespace zerod::comm::internal
