#include "runtime/engine/collective_log.h"

#include <xxhash.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace zerod::engine {

void CollectiveLog::Record(absl::string_view kind, int64_t count, DType dtype) {
  last_ = absl::StrCat("#", count_ + 1, " ", kind, "(", DTypeName(dtype), " x ", count, ")");
  const std::string entry = absl::StrCat(kind, ":", count, ":", static_cast<int>(dtype), ";");
  digest_ = XXH3_64bits_withSeed(entry.data(), entry.size(), digest_);
  ++count_;
}

absl::Status CollectiveLog::Compare(comm::Store& store, const std::string& tag, int64_t rank,
                                    int64_t world_size, absl::Duration timeout) const {
  const std::string mine = absl::StrCat(digest_, "|", count_, "|", last_);
  const std::string prefix = absl::StrCat("collectives/", tag, "/");
  if (absl::Status s = store.Set(prefix + absl::StrCat(rank), mine); !s.ok()) return s;
  std::vector<std::string> reports(static_cast<size_t>(world_size));
  std::vector<int64_t> silent;
  for (int64_t r = 0; r < world_size; ++r) {
    auto value = store.Get(prefix + absl::StrCat(r), timeout);
    if (!value.ok()) {
      silent.push_back(r);
      continue;
    }
    reports[static_cast<size_t>(r)] = *value;
  }
  if (!silent.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "collective check ", tag, silent.size() == 1 ? ": rank " : ": ranks ",
        absl::StrJoin(silent, ", "), " did not report within ", absl::FormatDuration(timeout),
        " (stuck in a collective the others did not call?); this rank is at ", last_));
  }
  std::vector<std::string> differ;
  const std::vector<std::string> base = absl::StrSplit(reports[0], absl::MaxSplits('|', 2));
  for (int64_t r = 1; r < world_size; ++r) {
    const std::vector<std::string> other =
        absl::StrSplit(reports[static_cast<size_t>(r)], absl::MaxSplits('|', 2));
    if (other[0] != base[0]) {
      differ.push_back(absl::StrCat("rank ", r, " at ", other.size() > 2 ? other[2] : "?"));
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("collective order diverged (", tag, "): ", absl::StrJoin(differ, ", "),
                   " vs rank 0 at ", base.size() > 2 ? base[2] : "?"));
}

}  // namespace zerod::engine
