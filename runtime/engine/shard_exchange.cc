#include "runtime/engine/shard_exchange.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace zerod::engine {

namespace {

constexpr char kMagic[8] = {'z', 'd', 'S', 'h', 'a', 'r', 'd', '1'};
constexpr size_t kHeaderBytes = 4096;  // a page: the shard after it is page-aligned
constexpr size_t kCacheLine = 64;

uint64_t RandomWord() {
  uint64_t word = 0;
  for (size_t got = 0; got < sizeof(word);) {
    const ssize_t n = ::getrandom(reinterpret_cast<char*>(&word) + got, sizeof(word) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    if (n < 0 && errno != EINTR) return static_cast<uint64_t>(::getpid()) * 0x9e3779b97f4a7c15ull;
  }
  return word;
}

// A mapping being set up: unmapped (and the name unlinked, while this rank must) unless kept.
struct Mapping {
  std::string name;  // set while this rank must still unlink it
  char* base = nullptr;
  size_t bytes = 0;
  ~Mapping() {
    if (base != nullptr) ::munmap(base, bytes);
    if (!name.empty()) ::shm_unlink(name.c_str());
  }
  char* Release() {
    char* b = base;
    base = nullptr;
    return b;
  }
};

}  // namespace

struct alignas(kCacheLine) ShardExchange::Header {
  char magic[8];
  uint64_t token;  // random, published beside the object's name: it is the one meant
  int64_t rank;
  int64_t bytes;
  // Write phases begun and ended (see the header comment), and whether the owner has gone; each
  // on a cache line of its own.
  alignas(kCacheLine) std::atomic<uint64_t> arrived{0};
  alignas(kCacheLine) std::atomic<uint64_t> published{0};
  alignas(kCacheLine) std::atomic<uint32_t> closed{0};
};
static_assert(sizeof(ShardExchange::Header) <= kHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared counters must be lock-free");

// A pull queued for the exchange's thread, and what became of it.
struct ShardExchange::Job {
  std::vector<Copy> copies;
  uint64_t phase = 0;
  absl::Time deadline;
  Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status result ABSL_GUARDED_BY(mu);
};

class ShardExchange::PullWork : public comm::Work {
 public:
  PullWork(ShardExchange* exchange, std::shared_ptr<Job> job)
      : exchange_(exchange), job_(std::move(job)) {}
  absl::Status Wait(absl::Duration timeout) override {
    Job& job = *job_;
    MutexLock lock(&job.mu);
    if (!job.mu.AwaitWithTimeout([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) { return job.done; },
                                 timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("stage-3 pull of ", job_->copies.size(),
                                                      " slices not done after ",
                                                      absl::FormatDuration(timeout)));
    }
    return job.result;
  }
  void Abort(const absl::Status& why) override { exchange_->Abort(why); }

 private:
  ShardExchange* exchange_;
  std::shared_ptr<Job> job_;
};

absl::StatusOr<std::unique_ptr<ShardExchange>> ShardExchange::Connect(comm::Store& store,
                                                                      const std::string& prefix,
                                                                      int64_t rank, int64_t world,
                                                                      int64_t bytes, bool enabled,
                                                                      absl::Duration timeout) {
  const size_t mapped = kHeaderBytes + static_cast<size_t>(bytes);
  std::vector<Mapping> maps(static_cast<size_t>(world));
  Mapping& own = maps[static_cast<size_t>(rank)];
  const uint64_t token = RandomWord();
  std::string published = "-";
  if (enabled && bytes >= 0) {
    const std::string name =
        absl::StrCat("/zerod-shard-", ::getpid(), "-", absl::Hex(RandomWord(), absl::kZeroPad16));
    const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd >= 0) {
      own.name = name;
      // Reserves the pages now: on a tmpfs that fills up later a touch would raise SIGBUS.
      void* base = ::posix_fallocate(fd, 0, static_cast<off_t>(mapped)) == 0
                       ? ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                       : MAP_FAILED;
      ::close(fd);
      if (base != MAP_FAILED) {
        own.base = static_cast<char*>(base);
        own.bytes = mapped;
        Header* h = new (own.base) Header();
        std::memcpy(h->magic, kMagic, sizeof(kMagic));
        h->token = token;
        h->rank = rank;
        h->bytes = bytes;
        published = absl::StrCat(name, ":", absl::Hex(token));
      }
    }
  }
  if (absl::Status s = store.Set(absl::StrCat(prefix, "/name/", rank), published); !s.ok()) {
    return s;
  }
  bool mine_ok = own.base != nullptr;
  for (int64_t r = 0; r < world; ++r) {
    if (r == rank) continue;
    auto value = store.Get(absl::StrCat(prefix, "/name/", r), timeout);
    if (!value.ok()) return value.status();
    const std::vector<std::string> fields = absl::StrSplit(*value, ':');
    uint64_t peer_token = 0;
    if (!mine_ok || fields.size() != 2 || !absl::SimpleHexAtoi(fields[1], &peer_token)) {
      mine_ok = false;
      continue;
    }
    const int fd = ::shm_open(fields[0].c_str(), O_RDONLY | O_CLOEXEC, 0);
    struct stat st {};
    if (fd < 0 || ::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != mapped) {
      if (fd >= 0) ::close(fd);
      mine_ok = false;
      continue;
    }
    void* base = ::mmap(nullptr, mapped, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (base == MAP_FAILED) {
      mine_ok = false;
      continue;
    }
    Mapping& m = maps[static_cast<size_t>(r)];
    m.base = static_cast<char*>(base);
    m.bytes = mapped;
    const Header* h = reinterpret_cast<const Header*>(m.base);
    mine_ok = std::memcmp(h->magic, kMagic, sizeof(kMagic)) == 0 && h->token == peer_token &&
              h->rank == r && h->bytes == bytes;
  }
  if (absl::Status s = store.Set(absl::StrCat(prefix, "/mapped/", rank), mine_ok ? "1" : "0");
      !s.ok()) {
    return s;
  }
  bool all_ok = mine_ok;
  for (int64_t r = 0; r < world; ++r) {
    auto value = store.Get(absl::StrCat(prefix, "/mapped/", r), timeout);
    if (!value.ok()) return value.status();
    all_ok = all_ok && *value == "1";
  }
  // Every rank has answered: nobody opens the names any more (each is unlinked by ~Mapping).
  if (!all_ok) return std::unique_ptr<ShardExchange>();
  std::vector<char*> bases;
  for (Mapping& m : maps) bases.push_back(m.Release());
  return std::unique_ptr<ShardExchange>(
      new ShardExchange(rank, world, bytes, std::move(bases), mapped));
}

ShardExchange::ShardExchange(int64_t rank, int64_t world, int64_t bytes, std::vector<char*> bases,
                             size_t mapped_bytes)
    : rank_(rank),
      world_(world),
      bytes_(bytes),
      mapped_bytes_(mapped_bytes),
      bases_(std::move(bases)) {
  for (char* base : bases_) shards_.push_back(base + kHeaderBytes);
  thread_ = std::thread([this] { Loop(); });
}

ShardExchange::~ShardExchange() {
  // A pull still waiting for a peer fails at once rather than at its deadline.
  Abort(absl::CancelledError("the shard exchange is closing"));
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  HeaderOf(rank_).closed.store(1, std::memory_order_release);
  for (char* base : bases_) ::munmap(base, mapped_bytes_);
}

ShardExchange::Header& ShardExchange::HeaderOf(int64_t rank) const {
  return *reinterpret_cast<Header*>(bases_[static_cast<size_t>(rank)]);
}

void ShardExchange::Abort(const absl::Status& why) {
  MutexLock lock(&abort_mu_);
  if (aborted_.load()) return;
  abort_reason_ = why;
  aborted_.store(true);
}

absl::Status ShardExchange::Await(const std::function<bool()>& done, absl::Time deadline,
                                  const std::string& what) {
  // Ranks often outnumber CPUs: yield between looks, then sleep a little longer each time.
  absl::Duration nap = absl::Microseconds(20);
  for (int spins = 0; !done(); ++spins) {
    if (aborted_.load()) {
      MutexLock lock(&abort_mu_);
      return abort_reason_;
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("stage-3 shard exchange: ", what));
    }
    if (spins < 200) {
      ::sched_yield();
    } else {
      absl::SleepFor(nap);
      nap = std::min(nap * 2, absl::Milliseconds(2));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardExchange::BeginWrite(absl::Duration timeout) {
  const uint64_t phase = phase_ + 1;
  HeaderOf(rank_).arrived.store(phase, std::memory_order_release);
  std::vector<int64_t> late;
  auto all_arrived = [&] {
    late.clear();
    for (int64_t r = 0; r < world_; ++r) {
      if (HeaderOf(r).arrived.load(std::memory_order_acquire) < phase) late.push_back(r);
    }
    return late.empty();
  };
  std::vector<int64_t> gone;
  auto arrived_or_gone = [&] {
    if (all_arrived()) return true;
    gone.clear();
    for (int64_t r : late) {
      if (HeaderOf(r).closed.load(std::memory_order_acquire) != 0) gone.push_back(r);
    }
    return !gone.empty();
  };
  absl::Status s = Await(arrived_or_gone, absl::Now() + timeout, "");
  if (s.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::DeadlineExceededError(
        absl::StrCat("stage-3 shard exchange: write phase ", phase,
                     " (a step, new parameters or a restore) not reached by ranks ",
                     absl::StrJoin(late, ", "), " within ", absl::FormatDuration(timeout),
                     " (are they stuck, or running other code than this rank?)"));
  }
  if (s.ok() && !gone.empty()) {
    s = absl::UnavailableError(
        absl::StrCat("stage-3 shard exchange: ranks ", absl::StrJoin(gone, ", "), " left the job"));
  }
  return s;
}

void ShardExchange::EndWrite() {
  ++phase_;
  HeaderOf(rank_).published.store(phase_, std::memory_order_release);
}

std::unique_ptr<comm::Work> ShardExchange::Pull(std::vector<Copy> copies, absl::Duration timeout) {
  auto job = std::make_shared<Job>();
  job->copies = std::move(copies);
  job->phase = phase_;
  job->deadline = absl::Now() + timeout;
  {
    MutexLock lock(&mu_);
    jobs_.push_back(job);
  }
  return std::make_unique<PullWork>(this, std::move(job));
}

absl::Status ShardExchange::RunCopies(const std::vector<Copy>& copies, uint64_t phase,
                                      absl::Time deadline) {
  for (const Copy& c : copies) {
    if (c.rank < 0 || c.rank >= world_ || c.offset < 0 || c.bytes < 0 ||
        c.offset + c.bytes > bytes_) {
      return absl::InvalidArgumentError(absl::StrCat("stage-3 shard exchange: bytes [", c.offset,
                                                     ", +", c.bytes, ") of rank ", c.rank,
                                                     "'s shard of ", bytes_));
    }
    const Header& h = HeaderOf(c.rank);
    if (c.rank != rank_) {
      bool gone = false;
      absl::Status s = Await(
          [&] {
            gone = h.closed.load(std::memory_order_acquire) != 0;
            return gone || h.published.load(std::memory_order_acquire) >= phase;
          },
          deadline,
          absl::StrCat("rank ", c.rank, " did not publish its parameters of phase ", phase,
                       " in time"));
      if (!s.ok()) return s;
      if (gone && h.published.load(std::memory_order_acquire) < phase) {
        return absl::UnavailableError(
            absl::StrCat("stage-3 shard exchange: rank ", c.rank, " left the job"));
      }
      bytes_pulled_.fetch_add(c.bytes, std::memory_order_relaxed);
    }
    std::memcpy(c.to, shards_[static_cast<size_t>(c.rank)] + c.offset,
                static_cast<size_t>(c.bytes));
  }
  pulls_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

void ShardExchange::Loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      MutexLock lock(&mu_);
      mu_.Await([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = jobs_.front();
      jobs_.pop_front();
    }
    absl::Status result = RunCopies(job->copies, job->phase, job->deadline);
    MutexLock lock(&job->mu);
    job->result = std::move(result);
    job->done = true;
  }
}

}  // namespace zerod::engine
