#include "server/rank_slots.h"

namespace zerod::server {

void RankSlots::Reset(int64_t world_size) {
  world_size_ = world_size;
  next_unused_ = 0;
  freed_.clear();
  lost_.clear();
  live_ = 0;
}

std::optional<int64_t> RankSlots::LowestFree() const {
  if (!freed_.empty()) return *freed_.begin();
  if (next_unused_ < world_size_) return next_unused_;
  return std::nullopt;
}

bool RankSlots::IsFree(int64_t rank) const {
  if (rank < 0 || rank >= world_size_) return false;
  return rank >= next_unused_ || freed_.contains(rank);
}

bool RankSlots::Take(int64_t rank) {
  if (!IsFree(rank)) return false;
  if (rank >= next_unused_) {
    for (int64_t r = next_unused_; r < rank; ++r) freed_.insert(r);
    next_unused_ = rank + 1;
  } else {
    freed_.erase(rank);
  }
  lost_.erase(rank);
  ++live_;
  return true;
}

bool RankSlots::Free(int64_t rank) {
  if (rank < 0 || rank >= world_size_ || IsFree(rank)) return false;
  freed_.insert(rank);
  --live_;
  return true;
}

bool RankSlots::MarkLost(int64_t rank) {
  if (!Free(rank)) return false;
  lost_.insert(rank);
  return true;
}

}  // namespace zerod::server
