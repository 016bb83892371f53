#include "server/rank_slots.h"

#include <iterator>

namespace zerod::server {

void RankSlots::Reset(int64_t world_size) {
  world_size_ = world_size;
  runs_.clear();
  lost_.clear();
  live_ = 0;
}

std::map<int64_t, int64_t>::const_iterator RankSlots::RunOf(int64_t rank) const {
  auto after = runs_.upper_bound(rank);
  if (after == runs_.begin()) return runs_.end();
  auto run = std::prev(after);
  return rank < run->second ? run : runs_.end();
}

std::optional<int64_t> RankSlots::LowestFree() const {
  // Runs never touch, so the first free rank is 0 or the end of a run that starts at 0.
  const int64_t lowest = runs_.empty() || runs_.begin()->first > 0 ? 0 : runs_.begin()->second;
  if (lowest < world_size_) return lowest;
  return std::nullopt;
}

bool RankSlots::IsFree(int64_t rank) const {
  if (rank < 0 || rank >= world_size_) return false;
  return RunOf(rank) == runs_.end();
}

bool RankSlots::Take(int64_t rank) {
  if (!IsFree(rank)) return false;
  int64_t first = rank;
  int64_t end = rank + 1;
  auto after = runs_.upper_bound(rank);
  if (after != runs_.end() && after->first == end) {
    end = after->second;
    after = runs_.erase(after);
  }
  if (after != runs_.begin()) {
    auto before = std::prev(after);
    if (before->second == rank) {
      first = before->first;
      runs_.erase(before);
    }
  }
  runs_.emplace(first, end);
  lost_.erase(rank);
  ++live_;
  return true;
}

bool RankSlots::Free(int64_t rank) {
  if (rank < 0 || rank >= world_size_) return false;
  auto run = RunOf(rank);
  if (run == runs_.end()) return false;
  const int64_t first = run->first;
  const int64_t end = run->second;
  runs_.erase(run);
  if (first < rank) runs_.emplace(first, rank);
  if (rank + 1 < end) runs_.emplace(rank + 1, end);
  --live_;
  return true;
}

bool RankSlots::MarkLost(int64_t rank) {
  if (!Free(rank)) return false;
  lost_.insert(rank);
  return true;
}

}  // namespace zerod::server
