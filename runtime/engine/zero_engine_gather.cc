// ZeroEngine's stage-3 gathers: the gather buffers, which unit each holds, prefetch, and the
// buffers beyond the plan's max_live_units taken when every planned one holds a unit in use.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/engine/zero_engine.h"

namespace zerod::engine {

absl::Status ZeroEngine::BeginShardWrite() {
  if (exchange_ == nullptr) return absl::OkStatus();
  // Every rank has stopped reading the shards once every rank is here: a barrier on the main
  // communicator says so as a collective, so a rank that is elsewhere (in a collective the others
  // do not call) is named by the order check at once rather than waited for.
  log_.Record("barrier", 0, DType::kFloat32);
  ZEROD_RETURN_IF_ERROR(Wait(comm_->Barrier(), WaitFor::kOther));
  return exchange_->BeginWrite(options_.collective_timeout);
}

void ZeroEngine::EndShardWrite() {
  if (exchange_ != nullptr) exchange_->EndWrite();
}

absl::Status ZeroEngine::LaunchGathers(const std::vector<std::pair<int64_t, int64_t>>& units) {
  if (exchange_ != nullptr) {
    // Every rank's slice straight from its shard: no collective, no other rank involved.
    const int64_t bytes = DTypeBytes(param_dtype());
    std::vector<ShardExchange::Copy> copies;
    for (const auto& [segment, gather] : units) {
      GatherBuffer& g = gathers_[static_cast<size_t>(gather)];
      for (int64_t r = 0; r < plan_->world_size(); ++r) {
        const plan::OwnedRange slice = plan_->SliceOf(r, segment);
        copies.push_back({r, slice.OffsetIn(plan::BufferLayout::kShard) * bytes,
                          slice.numel * bytes, g.buffer.Slice(slice)});
      }
    }
    const auto in_flight = std::make_shared<InFlight>();
    in_flight->work = exchange_->Pull(std::move(copies), options_.collective_timeout);
    MarkGathering(units, in_flight);
    return absl::OkStatus();
  }
  // Every copy first: a buffer is marked as gathering only once nothing can fail before the
  // all-gather is issued.
  for (const auto& [segment, gather] : units) {
    GatherBuffer& g = gathers_[static_cast<size_t>(gather)];
    const plan::OwnedRange mine = plan_->SliceOf(rank_, segment);
    ZEROD_RETURN_IF_ERROR(ops_->Copy(g.buffer.Slice(mine), params_.Slice(mine),
                                     mine.numel * DTypeBytes(param_dtype())));
  }
  const auto in_flight = std::make_shared<InFlight>();
  std::vector<comm::ChunkedBuffer> parts;
  for (const auto& [segment, gather] : units) {
    const plan::OwnedRange mine = plan_->SliceOf(rank_, segment);
    log_.Record("all_gather", mine.numel, param_dtype());
    parts.push_back({gathers_[static_cast<size_t>(gather)].buffer.memory.data(), mine.numel});
  }
  MarkGathering(units, in_flight);
  in_flight->work = gather_comm_->AllGatherGroup(parts, param_dtype());
  in_flight->work->Start();  // a prefetch: it overlaps the layers computed before it is needed
  return absl::OkStatus();
}

void ZeroEngine::MarkGathering(const std::vector<std::pair<int64_t, int64_t>>& units,
                               const std::shared_ptr<InFlight>& in_flight) {
  for (const auto& [segment, gather] : units) {
    GatherBuffer& g = gathers_[static_cast<size_t>(gather)];
    g.gather = in_flight;
    g.segment = segment;
    g.requested = false;
    g.last_use = 0;  // a prefetch nobody has asked for yet is the first to give way
    segments_[static_cast<size_t>(segment)].gather = gather;
  }
}

absl::Status ZeroEngine::WaitGather(int64_t gather) {
  return Wait(gathers_[static_cast<size_t>(gather)].gather, WaitFor::kGather);
}

absl::Status ZeroEngine::DropGather(int64_t g) {
  ZEROD_RETURN_IF_ERROR(WaitGather(g));
  GatherBuffer& buffer = gathers_[static_cast<size_t>(g)];
  segments_[static_cast<size_t>(buffer.segment)].gather = -1;
  buffer.segment = -1;
  buffer.requested = false;
  return absl::OkStatus();
}

absl::Status ZeroEngine::DropGatheredUnits() {
  for (size_t g = 0; g < gathers_.size(); ++g) {
    if (gathers_[g].segment >= 0) ZEROD_RETURN_IF_ERROR(DropGather(static_cast<int64_t>(g)));
  }
  ShrinkGatherBuffers();
  return absl::OkStatus();
}

int64_t ZeroEngine::AllocatedGatherBuffers() const {
  return std::count_if(gathers_.begin(), gathers_.end(),
                       [](const GatherBuffer& g) { return g.buffer.memory.data() != nullptr; });
}

void ZeroEngine::ShrinkGatherBuffers() {
  int64_t allocated = AllocatedGatherBuffers();
  for (GatherBuffer& g : gathers_) {
    if (allocated <= plan_->options().max_live_units) return;
    if (g.buffer.memory.data() == nullptr || g.segment >= 0) continue;
    g.buffer.memory = Buffer();
    --allocated;
  }
}

absl::StatusOr<int64_t> ZeroEngine::FreeGatherBuffer(int64_t keep, bool grow) {
  int64_t evict = -1;
  int64_t empty = -1;  // a slot whose memory was given back
  for (size_t g = 0; g < gathers_.size(); ++g) {
    const GatherBuffer& b = gathers_[g];
    if (b.buffer.memory.data() == nullptr) {
      if (empty < 0) empty = static_cast<int64_t>(g);
      continue;
    }
    if (b.segment < 0) return static_cast<int64_t>(g);
    if (b.requested || b.segment == keep) continue;
    if (evict < 0 || b.last_use < gathers_[static_cast<size_t>(evict)].last_use) {
      evict = static_cast<int64_t>(g);
    }
  }
  if (evict >= 0) {
    ZEROD_RETURN_IF_ERROR(DropGather(evict));
    return evict;
  }
  if (!grow) return -1;
  // Every buffer holds a unit something still refers to: one more, beyond the plan's, given back
  // when a release brings the count over the plan again.
  if (empty < 0) {
    gathers_.emplace_back();
    empty = static_cast<int64_t>(gathers_.size()) - 1;
  }
  GatherBuffer& slot = gathers_[static_cast<size_t>(empty)];
  ZEROD_ASSIGN_OR_RETURN(Buffer memory, Buffer::Allocate(ops_, param_dtype(), gather_numel_));
  slot.buffer = PlannedBuffer{std::move(memory), gather_layout_};
  ++gather_overflows_;
  peak_gather_buffers_ = std::max(peak_gather_buffers_, AllocatedGatherBuffers());
  return empty;
}

absl::Status ZeroEngine::Gather(int64_t unit) {
  if (unit < 0 || unit >= num_units()) {
    return absl::InvalidArgumentError(
        absl::StrCat("engine: no gather unit ", unit, " (plan has ", num_units(), ")"));
  }
  if (stage_ < 3) return absl::OkStatus();
  if (last_gathered_ >= 0 && unit != last_gathered_) direction_ = unit > last_gathered_ ? 1 : -1;
  last_gathered_ = unit;
  // The next unit in the direction of travel is prefetched while this one is in use, into a free
  // buffer or in place of the unit released longest ago: a prefetch never displaces a unit that
  // is asked for and not released, and never takes a buffer beyond the plan's.
  const int64_t next = unit + direction_;
  auto wants_prefetch = [&] {
    return plan_->options().prefetch_depth > 0 && next >= 0 && next < num_units() &&
           segments_[static_cast<size_t>(next)].gather < 0;
  };
  if (segments_[static_cast<size_t>(unit)].gather < 0) {
    ZEROD_ASSIGN_OR_RETURN(const int64_t g, FreeGatherBuffer(/*keep=*/-1, /*grow=*/true));
    std::vector<std::pair<int64_t, int64_t>> launch = {{unit, g}};
    if (wants_prefetch() &&
        SegmentBytes(unit, param_dtype()) + SegmentBytes(next, param_dtype()) <= kCoalesceBytes) {
      // Small: the prefetch goes in the same all-gather. Buffer g is claimed first, so that
      // finding the prefetch a buffer passes it over.
      GatherBuffer& claimed = gathers_[static_cast<size_t>(g)];
      claimed.segment = unit;
      claimed.requested = true;
      absl::StatusOr<int64_t> free = FreeGatherBuffer(/*keep=*/unit, /*grow=*/false);
      if (!free.ok()) {
        claimed.segment = -1;
        claimed.requested = false;
        return free.status();
      }
      if (*free >= 0) launch.emplace_back(next, *free);
    }
    ZEROD_RETURN_IF_ERROR(LaunchGathers(launch));
  }
  const int64_t g = segments_[static_cast<size_t>(unit)].gather;
  gathers_[static_cast<size_t>(g)].requested = true;
  gathers_[static_cast<size_t>(g)].last_use = ++gather_clock_;
  ZEROD_RETURN_IF_ERROR(WaitGather(g));
  if (wants_prefetch()) {
    ZEROD_ASSIGN_OR_RETURN(const int64_t free, FreeGatherBuffer(/*keep=*/unit, /*grow=*/false));
    if (free >= 0) ZEROD_RETURN_IF_ERROR(LaunchGathers({{next, free}}));
  }
  return absl::OkStatus();
}

absl::Status ZeroEngine::Release(int64_t unit) {
  if (stage_ < 3) return absl::OkStatus();
  if (unit < 0 || unit >= num_units() || segments_[static_cast<size_t>(unit)].gather < 0 ||
      !gathers_[static_cast<size_t>(segments_[static_cast<size_t>(unit)].gather)].requested) {
    return absl::FailedPreconditionError(absl::StrCat("engine: unit ", unit, " is not gathered"));
  }
  // Kept until its buffer is needed (see GatherBuffer): evictable from now on; given back at once
  // when more buffers than the plan's hold units.
  const int64_t index = segments_[static_cast<size_t>(unit)].gather;
  GatherBuffer& g = gathers_[static_cast<size_t>(index)];
  g.requested = false;
  g.last_use = ++gather_clock_;
  if (AllocatedGatherBuffers() > plan_->options().max_live_units) {
    ZEROD_RETURN_IF_ERROR(DropGather(index));
    g.buffer.memory = Buffer();
  }
  return absl::OkStatus();
}

}  // namespace zerod::engine
