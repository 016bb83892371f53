#include "runtime/common/thread_pool.h"

#include <algorithm>

namespace zerod {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { Work(); });
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t parts = std::min<int64_t>(size(), (n + grain - 1) / grain);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  const int64_t per = (n / parts + grain - 1) / grain * grain;
  MutexLock lock(&mu_);
  mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return task_ == nullptr; });
  chunks_.clear();
  for (int64_t begin = 0; begin < n; begin += per)
    chunks_.emplace_back(begin, std::min(n, begin + per));
  next_chunk_ = 0;
  pending_ = static_cast<int64_t>(chunks_.size());
  task_ = &fn;
  // The caller works too, then waits for the rest.
  while (next_chunk_ < chunks_.size()) {
    const auto [begin, end] = chunks_[next_chunk_++];
    mu_.Unlock();
    fn(begin, end);
    mu_.Lock();
    --pending_;
  }
  mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return pending_ == 0; });
  task_ = nullptr;
}

void ThreadPool::Work() {
  MutexLock lock(&mu_);
  for (;;) {
    mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || (task_ != nullptr && next_chunk_ < chunks_.size());
    });
    if (stopping_) return;
    const auto [begin, end] = chunks_[next_chunk_++];
    const auto* task = task_;
    mu_.Unlock();
    (*task)(begin, end);
    mu_.Lock();
    --pending_;
  }
}

}  // namespace zerod
