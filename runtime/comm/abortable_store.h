#ifndef ZEROD_RUNTIME_COMM_ABORTABLE_STORE_H_
#define ZEROD_RUNTIME_COMM_ABORTABLE_STORE_H_

// A Store whose blocking waits (Get, Wait) end soon after Abort, with its reason, as a
// communicator's collectives do: a rank the coordinator declared lost may be waiting on its peers'
// keys (a rendezvous, a collective-order check), and the peers that would write them are gone.
// The inner store's waits cannot be interrupted, so they run in slices of `slice`, the abort
// checked between slices.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/comm/store.h"
#include "runtime/common/mutex.h"

namespace zerod::comm {

class AbortableStore final : public Store {
 public:
  explicit AbortableStore(std::shared_ptr<Store> inner, absl::Duration slice = absl::Seconds(1))
      : inner_(std::move(inner)), slice_(slice) {}

  // Every wait in progress or to come fails with `why` (the first reason wins).
  void Abort(const absl::Status& why) {
    MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = why;
  }

  absl::Status Set(const std::string& key, const std::string& value) override {
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::StatusOr<std::string> value;
    absl::Status s = Sliced(timeout, [&](absl::Duration part) {
      value = inner_->Get(key, part);
      return value.status();
    });
    if (!s.ok()) return s;
    return value;
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return inner_->Add(key, delta);
  }
  absl::StatusOr<std::string> CompareSet(const std::string& key,
                                         const std::optional<std::string>& expected,
                                         const std::string& desired) override {
    return inner_->CompareSet(key, expected, desired);
  }
  absl::StatusOr<bool> Delete(const std::string& key) override { return inner_->Delete(key); }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    return Sliced(timeout, [&](absl::Duration part) { return inner_->Wait(keys, part); });
  }

 private:
  template <typename Attempt>
  absl::Status Sliced(absl::Duration timeout, Attempt attempt) {
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      {
        MutexLock lock(&mu_);
        if (!aborted_.ok()) return aborted_;
      }
      const absl::Duration left = std::max(deadline - absl::Now(), absl::ZeroDuration());
      absl::Status s = attempt(std::min(left, slice_));
      if (s.code() != absl::StatusCode::kDeadlineExceeded || left <= slice_) {
        if (s.code() != absl::StatusCode::kDeadlineExceeded || timeout <= slice_) return s;
        return absl::Status(
            s.code(), absl::StrCat(s.message(), " (", absl::FormatDuration(timeout), " in all)"));
      }
    }
  }

  const std::shared_ptr<Store> inner_;
  const absl::Duration slice_;
  Mutex mu_;
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace zerod::comm

#endif  // ZEROD_RUNTIME_COMM_ABORTABLE_STORE_H_
