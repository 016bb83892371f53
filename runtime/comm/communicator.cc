#include "runtime/comm/communicator.h"

#include <algorithm>
#include <utility>

namespace zerod::comm {
namespace {

// The Work of collectives issued one after the other: waits for each in turn, within one timeout.
class WorkGroup final : public Work {
 public:
  explicit WorkGroup(std::vector<std::unique_ptr<Work>> works) : works_(std::move(works)) {}

  absl::Status Wait(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    for (; waited_ < works_.size(); ++waited_) {
      absl::Status s =
          works_[waited_]->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
      if (s.code() == absl::StatusCode::kDeadlineExceeded) return s;  // may be waited for again
      if (!s.ok()) {
        // One failed: the rest cannot be trusted to complete (a backend need not have failed
        // them), so they are aborted, and waited for until their buffers are let go (an aborted
        // work's Wait returns once nothing can land).
        for (size_t i = waited_ + 1; i < works_.size(); ++i) {
          works_[i]->Abort(s);
          (void)works_[i]->Wait(timeout);
        }
        waited_ = works_.size();
        failure_ = s;
        return s;
      }
    }
    return failure_;
  }

  void Start() override {
    for (auto& work : works_) work->Start();
  }

  void Abort(const absl::Status& why) override {
    for (auto& work : works_) work->Abort(why);
  }

 private:
  std::vector<std::unique_ptr<Work>> works_;
  size_t waited_ = 0;  // works that returned (in order)
  absl::Status failure_;
};

}  // namespace

std::unique_ptr<Work> Communicator::ReduceScatterGroup(const std::vector<ChunkedBuffer>& buffers,
                                                       DType dtype) {
  std::vector<std::unique_ptr<Work>> works;
  for (const ChunkedBuffer& b : buffers)
    works.push_back(ReduceScatter(b.data, b.chunk_count, dtype));
  return std::make_unique<WorkGroup>(std::move(works));
}

std::unique_ptr<Work> Communicator::AllGatherGroup(const std::vector<ChunkedBuffer>& buffers,
                                                   DType dtype) {
  std::vector<std::unique_ptr<Work>> works;
  for (const ChunkedBuffer& b : buffers) works.push_back(AllGather(b.data, b.chunk_count, dtype));
  return std::make_unique<WorkGroup>(std::move(works));
}

}  // namespace zerod::comm
