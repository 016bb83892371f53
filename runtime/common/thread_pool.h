#ifndef ZEROD_RUNTIME_COMMON_THREAD_POOL_H_
#define ZEROD_RUNTIME_COMMON_THREAD_POOL_H_

// A fixed pool of worker threads for data-parallel loops (the optimizer step). Owns its threads;
// the destructor stops and joins them.

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "runtime/common/mutex.h"

namespace zerod {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Splits [0, n) into at most size() contiguous chunks whose boundaries are multiples of
  // `grain`, runs fn(begin, end) on each (the caller's thread takes one), and returns when all
  // are done. Concurrent callers take turns.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void Work();

  Mutex mu_;
  const std::function<void(int64_t, int64_t)>* task_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<std::pair<int64_t, int64_t>> chunks_ ABSL_GUARDED_BY(mu_);
  size_t next_chunk_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;
};

}  // namespace zerod

#endif  // ZEROD_RUNTIME_COMMON_THREAD_POOL_H_
