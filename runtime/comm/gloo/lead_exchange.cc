#include "runtime/comm/gloo/lead_exchange.h"

#include <gloo/context.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace zerod::comm::internal {
namespace {

// Leads travel on slots of their own, above any Gloo's own algorithms take (Context::nextSlot
// counts up from 0 in an int), one per collective so a late lead can never match another's.
constexpr uint64_t kLeadSlots = uint64_t{1} << 62;

constexpr uint64_t kMagic = 0x316461654c646f72;  // "rodLead1", a lead of this wire version

struct WireLead {
  uint64_t magic = kMagic;
  int64_t sequence = 0;
  int64_t kind = 0;
  int64_t count = 0;
  int64_t dtype = 0;
  int64_t root = 0;
  int64_t payload_bytes = 0;
  int64_t all_to_all_max_world = 0;  // the sender's lead options, which every rank must share
};

WireLead ToWire(const CollectiveDescriptor& d, size_t payload_bytes, int64_t max_world) {
  WireLead w;
  w.all_to_all_max_world = max_world;
  w.sequence = d.sequence;
  w.kind = static_cast<int64_t>(d.kind);
  w.count = d.count;
  w.dtype = static_cast<int64_t>(d.dtype);
  w.root = d.root;
  w.payload_bytes = static_cast<int64_t>(payload_bytes);
  return w;
}

bool SameCollective(const WireLead& a, const WireLead& b) {
  return a.sequence == b.sequence && a.kind == b.kind && a.count == b.count && a.dtype == b.dtype &&
         a.root == b.root;
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
  if (d.kind == CollectiveKind::kBroadcast) absl::StrAppend(&s, " from rank ", d.root);
  return s;
}

struct LeadExchange::Peer {
  int rank = 0;
  std::vector<char> in;  // the lead received, then its inline data
  std::vector<char> out;
  std::unique_ptr<gloo::transport::UnboundBuffer> in_buffer;
  std::unique_ptr<gloo::transport::UnboundBuffer> out_buffer;
  size_t payload_bytes = 0;  // of the last lead received
  int sends = 0;             // sends issued from `out` in the current exchange
};

LeadExchange::LeadExchange(std::shared_ptr<gloo::Context> context, int64_t rank, int64_t world_size,
                           int64_t all_to_all_max_world, std::chrono::milliseconds timeout)
    : context_(std::move(context)),
      rank_(rank),
      all_to_all_max_world_(all_to_all_max_world),
      all_to_all_(world_size <= all_to_all_max_world),
      timeout_(timeout) {
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
    p->in.resize(capacity);
    p->out.resize(capacity);
    p->in_buffer = context_->createUnboundBuffer(p->in.data(), p->in.size());
    p->out_buffer = context_->createUnboundBuffer(p->out.data(), p->out.size());
    slots_.push_back(std::move(p));
  }
  PostReceives(1);  // so that even the first collective's leads go out at once
}

// The owner closes the transport first (GlooCommunicator aborts before it destroys this), so no
// lead can land in a receive still posted.
LeadExchange::~LeadExchange() = default;

void LeadExchange::PostReceives(int64_t sequence) {
  for (auto& p : slots_) p->in_buffer->recv(p->rank, kLeadSlots + static_cast<uint64_t>(sequence));
  posted_sequence_ = sequence;
}

void LeadExchange::Exchange(const CollectiveDescriptor& mine, const PayloadFor& payload) {
  if (slots_.empty()) return;
  if (!broken_why_.empty()) {
    throw std::runtime_error(
        absl::StrCat("the connections broke after collective #", broken_after_, ": ", broken_why_));
  }
  if (posted_sequence_ != mine.sequence) PostReceives(mine.sequence);
  const uint64_t slot = kLeadSlots + static_cast<uint64_t>(mine.sequence);
  // A payload that goes to several peers is copied once and sent from the same buffer.
  Peer* last_sender = nullptr;
  std::pair<const void*, size_t> last_payload{nullptr, 0};
  for (auto& p : slots_) {
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
      const WireLead header = ToWire(mine, data.second, all_to_all_max_world_);
      std::memcpy(sender->out.data(), &header, sizeof(header));
      if (data.second > 0) {
        std::memcpy(sender->out.data() + sizeof(header), data.first, data.second);
      }
      last_sender = sender;
      last_payload = data;
    }
    sender->out_buffer->send(p->rank, slot, 0, sizeof(WireLead) + data.second);
    ++sender->sends;
  }
  const WireLead expected = ToWire(mine, 0, all_to_all_max_world_);
  for (auto& p : slots_) {
    if (!p->in_buffer->waitRecv(timeout_)) {
      throw std::runtime_error(
          absl::StrCat("the lead of ", Describe(mine), " from rank ", p->rank, " was aborted"));
    }
    WireLead theirs;
    std::memcpy(&theirs, p->in.data(), sizeof(theirs));
    if (theirs.magic != kMagic) {
      throw std::runtime_error(
          absl::StrCat("rank ", p->rank, " sent a lead of another zerod wire version"));
    }
    if (theirs.all_to_all_max_world != all_to_all_max_world_) {
      throw std::runtime_error(absl::StrCat(
          "rank ", p->rank, " exchanges leads with every other rank up to worlds of ",
          theirs.all_to_all_max_world, " ranks, rank ", rank_, " up to ", all_to_all_max_world_,
          ": every rank must be given the same GlooOptions::lead_all_to_all_max_world"));
    }
    if (!SameCollective(theirs, expected)) {
      throw std::runtime_error(absl::StrCat("collective mismatch: rank ", rank_, " called ",
                                            Describe(mine), ", rank ", p->rank, " called ",
                                            DescribeWire(theirs)));
    }
    if (theirs.payload_bytes < 0 ||
        static_cast<size_t>(theirs.payload_bytes) > p->in.size() - sizeof(WireLead)) {
      throw std::runtime_error(absl::StrCat("rank ", p->rank, " sent a lead claiming ",
                                            theirs.payload_bytes, " bytes of data"));
    }
    p->payload_bytes = static_cast<size_t>(theirs.payload_bytes);
  }
  // Every peer had posted its receive before it sent its lead, so these complete at once.
  for (auto& p : slots_) {
    for (; p->sends > 0; --p->sends) {
      if (!p->out_buffer->waitSend(timeout_)) {
        throw std::runtime_error(
            absl::StrCat("the lead of ", Describe(mine), " to rank ", p->rank, " was aborted"));
      }
    }
  }
}

std::pair<char*, size_t> LeadExchange::Payload(int peer) {
  for (auto& p : slots_) {
    if (p->rank == peer) return {p->in.data() + sizeof(WireLead), p->payload_bytes};
  }
  throw std::logic_error(absl::StrCat("rank ", peer, " is not a lead peer of rank ", rank_));
}

void LeadExchange::Release() {
  if (slots_.empty()) return;
  // The collective that just ended is complete whatever happens here: a peer that finished first
  // may have closed its connections already (its communicator destroyed at the end of a job),
  // and posting a receive on them throws. The next collective reports that, if there is one.
  try {
    PostReceives(posted_sequence_ + 1);
  } catch (const std::exception& e) {
    broken_after_ = posted_sequence_;
    broken_why_ = e.what();
  }
}

}  // namespace zerod::comm::internal
