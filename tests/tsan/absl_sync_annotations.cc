// Linked into every executable of a ZEROD_SANITIZE=thread build (cmake/ZerodTargets.cmake): makes
// abseil's Mutex and CondVar, as Debian ships them, visible to ThreadSanitizer.
//
// Our code uses zerod::Mutex, which TSan sees. gRPC does not: it hands calls, completions and
// callbacks between its threads under absl::Mutex and absl::CondVar, and Debian's abseil is built
// without TSan's annotations, so TSan reports gRPC talking to itself, and our handler writing a
// response before Finish() as racing with gRPC's thread that later serializes and frees it. These
// definitions take the place of abseil's exported lock functions in the executable (the dynamic
// linker binds libgrpc's and libabsl's own calls to the executable's copy), tell TSan what each
// does with the same annotations abseil uses when built for TSan, and call abseil's real function,
// found with dlsym(RTLD_NEXT). Accesses inside the real functions are ignored, as abseil's own
// annotations ignore them (between pre- and post-lock TSan ignores the thread).
//
// Only lock, unlock, wait and destroy are modelled; absl's deadlock detector and debug logging
// keep working unannotated.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"

namespace {

#define ZEROD_STRINGIFY_INNER(x) #x
#define ZEROD_STRINGIFY(x) ZEROD_STRINGIFY_INNER(x)

// Abseil's real function: `suffix` is the Itanium mangling after the inline namespace, e.g.
// "5Mutex4LockEv" for absl::<ns>::Mutex::Lock().
template <typename Fn>
Fn Real(const char* suffix) {
  const std::string ns = ZEROD_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = "_ZN4absl" + std::to_string(ns.size()) + ns + suffix;
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "absl_sync_annotations: %s not found: %s\n", name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;
constexpr unsigned kTryFailed = __tsan_mutex_try_lock_failed;

// Abseil's functions call each other (CondVar::WaitWithTimeout calls WaitWithDeadline, through
// the same exported symbols): only the outermost call on a thread is annotated.
thread_local int depth = 0;

struct Nested {
  Nested() { ++depth; }
  ~Nested() { --depth; }
  Nested(const Nested&) = delete;
  Nested& operator=(const Nested&) = delete;
};

template <typename F>
auto Locking(absl::Mutex* mu, unsigned flags, F&& lock) {
  if (depth > 0) return lock();
  Nested nested;
  __tsan_mutex_pre_lock(mu, flags);
  auto result = lock();
  __tsan_mutex_post_lock(mu, flags, 0);
  return result;
}

template <typename F>
auto TryLocking(absl::Mutex* mu, unsigned flags, F&& try_lock) {
  if (depth > 0) return try_lock();
  Nested nested;
  __tsan_mutex_pre_lock(mu, flags | kTry);
  const bool locked = try_lock();
  __tsan_mutex_post_lock(mu, locked ? flags | kTry : flags | kTry | kTryFailed, 0);
  return locked;
}

template <typename F>
void Unlocking(absl::Mutex* mu, unsigned flags, F&& unlock) {
  if (depth > 0) return unlock();
  Nested nested;
  __tsan_mutex_pre_unlock(mu, flags);
  unlock();
  __tsan_mutex_post_unlock(mu, flags);
}

// Await and CondVar waits release `mu` and hold it again when they return.
template <typename F>
auto Waiting(absl::Mutex* mu, F&& wait) {
  if (depth > 0) return wait();
  Nested nested;
  __tsan_mutex_pre_unlock(mu, 0);
  auto result = wait();
  __tsan_mutex_post_unlock(mu, 0);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return result;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

using Cond = const Condition&;

void Mutex::Lock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<void (*)(Mutex*)>("5Mutex4LockEv");
  Locking(this, 0, [&] { return (real(this), 0); });
}

void Mutex::ReaderLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  Locking(this, kRead, [&] { return (real(this), 0); });
}

bool Mutex::TryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  return TryLocking(this, 0, [&] { return real(this); });
}

bool Mutex::ReaderTryLock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  return TryLocking(this, kRead, [&] { return real(this); });
}

void Mutex::Unlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Unlocking(this, 0, [&] { real(this); });
}

void Mutex::ReaderUnlock() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Unlocking(this, kRead, [&] { real(this); });
}

void Mutex::LockWhen(Cond cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<void (*)(Mutex*, Cond)>("5Mutex8LockWhenERKNS0_9ConditionE");
  Locking(this, 0, [&] { return (real(this, cond), 0); });
}

bool Mutex::LockWhenWithTimeout(Cond cond, Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<bool (*)(Mutex*, Cond, Duration)>(
      "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(Cond cond, Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<bool (*)(Mutex*, Cond, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, 0, [&] { return real(this, cond, deadline); });
}

void Mutex::ReaderLockWhen(Cond cond) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<void (*)(Mutex*, Cond)>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Locking(this, kRead, [&] { return (real(this, cond), 0); });
}

bool Mutex::ReaderLockWhenWithTimeout(Cond cond, Duration timeout) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<bool (*)(Mutex*, Cond, Duration)>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Locking(this, kRead, [&] { return real(this, cond, timeout); });
}

bool Mutex::ReaderLockWhenWithDeadline(Cond cond, Time deadline) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static auto real = Real<bool (*)(Mutex*, Cond, Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Locking(this, kRead, [&] { return real(this, cond, deadline); });
}

void Mutex::Await(Cond cond) {
  static auto real = Real<void (*)(Mutex*, Cond)>("5Mutex5AwaitERKNS0_9ConditionE");
  Waiting(this, [&] { return (real(this, cond), 0); });
}

bool Mutex::AwaitWithTimeout(Cond cond, Duration timeout) {
  static auto real = Real<bool (*)(Mutex*, Cond, Duration)>(
      "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Waiting(this, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(Cond cond, Time deadline) {
  static auto real =
      Real<bool (*)(Mutex*, Cond, Time)>("5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Waiting(this, [&] { return real(this, cond, deadline); });
}

Mutex::~Mutex() {
  static auto real = Real<void (*)(Mutex*)>("5MutexD2Ev");
  if (depth == 0) __tsan_mutex_destroy(this, 0);
  Nested nested;
  real(this);
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Waiting(mu, [&] { return (real(this, mu), 0); });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Waiting(mu, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto real =
      Real<bool (*)(CondVar*, Mutex*, Time)>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Waiting(mu, [&] { return real(this, mu, deadline); });
}

ABSL_NAMESPACE_END
}  // namespace absl
