#ifndef ZEROD_SERVER_RANK_SLOTS_H_
#define ZEROD_SERVER_RANK_SLOTS_H_

// RankSlots: which ranks of a job are free for the next joiner, how many are live (joining or
// active), and which were lost and not yet replaced. Not thread-safe: the job's lock guards it.
//
// Memory grows with the runs of live ranks, never with the world size or with the rank a join
// names: a join at rank 2^24-1 of a 2^24-rank world costs one entry, as does a job that fills up
// in order.

#include <cstdint>
#include <map>
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
  // The run of live ranks holding `rank`, or end().
  std::map<int64_t, int64_t>::const_iterator RunOf(int64_t rank) const;

  int64_t world_size_ = 0;
  // Live ranks as disjoint, non-adjacent runs [first, end): first -> end.
  std::map<int64_t, int64_t> runs_;
  std::set<int64_t> lost_;  // free ranks whose member was lost
  int64_t live_ = 0;
};

}  // namespace zerod::server

#endif  // ZEROD_SERVER_RANK_SLOTS_H_
