#ifndef ZEROD_SERVER_RANK_SLOTS_H_
#define ZEROD_SERVER_RANK_SLOTS_H_

// RankSlots: which ranks of a job are free for the next joiner, how many are live (joining or
// active), and which were lost and not yet replaced. Not thread-safe: the job's lock guards it.
//
// Memory grows with the ranks freed, not with the world size, so a 16M-rank job that fills up in
// order keeps no per-rank bookkeeping here.

#include <cstdint>
#include <optional>
#include <set>

namespace zerod::server {

class RankSlots {
 public:
  // Every rank of a world of `world_size` free, none live, none lost.
  void Reset(int64_t world_size);

  // The lowest free rank; nullopt when every rank is live.
  std::optional<int64_t> LowestFree() const;
  bool IsFree(int64_t rank) const;

  // Makes a free `rank` live (and no longer lost). Returns false, changing nothing, when it is
  // live already or outside the world.
  bool Take(int64_t rank);
  // Frees a live `rank`. Returns false, changing nothing, when it was not live.
  bool Free(int64_t rank);
  // Frees a live `rank` and remembers it as lost until it is taken again.
  bool MarkLost(int64_t rank);

  int64_t world_size() const { return world_size_; }
  int64_t live() const { return live_; }
  const std::set<int64_t>& lost() const { return lost_; }

 private:
  int64_t world_size_ = 0;
  int64_t next_unused_ = 0;  // ranks at or above it were never taken
  std::set<int64_t> freed_;  // below next_unused_, and free
  std::set<int64_t> lost_;   // a subset of freed_
  int64_t live_ = 0;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_RANK_SLOTS_H_
