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

constexpr uint64_t kMagic = 0x336461654c646f72;  // "rodLead3", a lead of this wire version

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
  // Two of each, by the parity of the collective's sequence: the receive of the next lead is
  // posted, and the next lead sent, while a deferred one (a broadcast's, from a rank that is not
  // its root) may still be in flight on the other.
  std::vector<char> in[2];  // the lead received, then its inline data
  std::vector<char> out[2];
  std::unique_ptr<gloo::transport::UnboundBuffer> in_buffer[2];
  std::unique_ptr<gloo::transport::UnboundBuffer> out_buffer[2];
  int sends[2] = {0, 0};     // sends issued from `out` and not yet waited for
  size_t payload_bytes = 0;  // of the last lead received
  bool deferred = false;     // the last exchange's lead from this peer is not checked yet
};

LeadExchange::LeadExchange(std::shared_ptr<gloo::Context> context, int64_t rank, int64_t world_size,
                           LeadOptions options, std::chrono::milliseconds timeout)
    : context_(std::move(context)),
      rank_(rank),
      options_(options),
      all_to_all_(world_size <= options.all_to_all_max_world),
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
    for (int i = 0; i < 2; ++i) {
      p->in[i].resize(capacity);
      p->out[i].resize(capacity);
      p->in_buffer[i] = context_->createUnboundBuffer(p->in[i].data(), p->in[i].size());
      p->out_buffer[i] = context_->createUnboundBuffer(p->out[i].data(), p->out[i].size());
    }
    slots_.push_back(std::move(p));
  }
  PostReceives(1);  // so that even the first collective's leads go out at once
}

// The owner closes the transport first (GlooCommunicator aborts before it destroys this), so no
// lead can land in a receive still posted.
LeadExchange::~LeadExchange() = default;

void LeadExchange::PostReceives(int64_t sequence) {
  for (auto& p : slots_) {
    p->in_buffer[sequence & 1]->recv(p->rank, kLeadSlots + static_cast<uint64_t>(sequence));
  }
  posted_sequence_ = sequence;
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
  const int parity = static_cast<int>(mine.sequence & 1);
  if (!p.in_buffer[parity]->waitRecv(timeout_)) {
    throw std::runtime_error(
        absl::StrCat("the lead of ", Describe(mine), " from rank ", p.rank, " was aborted"));
  }
  WireLead theirs;
  std::memcpy(&theirs, p.in[parity].data(), sizeof(theirs));
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
  if (!SameCollective(theirs, ToWire(mine, 0, options_))) {
    std::string theirs_described = DescribeWire(theirs);
    // Groups of as many buffers and elements, cut otherwise, read the same.
    if (theirs_described == Describe(mine)) theirs_described += " with its buffers cut otherwise";
    throw std::runtime_error(absl::StrCat("collective mismatch: rank ", rank_, " called ",
                                          Describe(mine), ", rank ", p.rank, " called ",
                                          theirs_described));
  }
  if (theirs.payload_bytes < 0 ||
      static_cast<size_t>(theirs.payload_bytes) > p.in[parity].size() - sizeof(WireLead)) {
    throw std::runtime_error(absl::StrCat("rank ", p.rank, " sent a lead claiming ",
                                          theirs.payload_bytes, " bytes of data"));
  }
  p.payload_bytes = static_cast<size_t>(theirs.payload_bytes);
}

void LeadExchange::Exchange(const CollectiveDescriptor& mine, const PayloadFor& payload,
                            int only_from) {
  if (slots_.empty()) return;
  if (!broken_why_.empty()) {
    throw std::runtime_error(
        absl::StrCat("the connections broke after collective #", broken_after_, ": ", broken_why_));
  }
  if (posted_sequence_ != mine.sequence) PostReceives(mine.sequence);
  const uint64_t slot = kLeadSlots + static_cast<uint64_t>(mine.sequence);
  const int parity = static_cast<int>(mine.sequence & 1);
  const auto awaited = [&](const Peer& p) {
    return only_from < 0 || !all_to_all_ || p.rank == only_from;
  };
  // A payload that goes to several peers is copied once and sent from the same buffer (only
  // to peers waited for now: a deferred peer's sends are waited for at the next exchange).
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
    if (last_sender != nullptr && data == last_payload && awaited(*p)) {
      sender = last_sender;
    } else {
      const WireLead header = ToWire(mine, data.second, options_);
      std::memcpy(sender->out[parity].data(), &header, sizeof(header));
      if (data.second > 0) {
        std::memcpy(sender->out[parity].data() + sizeof(header), data.first, data.second);
      }
      if (awaited(*p)) {
        last_sender = sender;
        last_payload = data;
      }
    }
    sender->out_buffer[parity]->send(p->rank, slot, 0, sizeof(WireLead) + data.second);
    ++sender->sends[parity];
  }
  // The leads the last exchange did not wait for were sent as that collective started, so they
  // are here by now or nearly; checked before any data of this collective moves.
  for (auto& p : slots_) {
    if (!p->deferred) continue;
    p->deferred = false;
    Check(*p, deferred_of_);
    WaitSends(*p, parity ^ 1, deferred_of_);
  }
  for (auto& p : slots_) {
    if (awaited(*p)) {
      Check(*p, mine);
    } else {
      p->deferred = true;
    }
  }
  deferred_of_ = mine;
  // Every peer waited for had posted its receive before it sent its lead, so these complete at
  // once.
  for (auto& p : slots_) {
    if (!p->deferred) WaitSends(*p, parity, mine);
  }
}

std::pair<char*, size_t> LeadExchange::Payload(int peer) {
  for (auto& p : slots_) {
    if (p->rank == peer) {
      return {p->in[posted_sequence_ & 1].data() + sizeof(WireLead), p->payload_bytes};
    }
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
