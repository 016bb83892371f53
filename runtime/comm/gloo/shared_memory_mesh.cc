#include "runtime/comm/gloo/shared_memory_mesh.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <optional>
#include <stdexcept>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "runtime/comm/gloo/element_sum.h"

namespace zerod::comm::internal {

namespace {

constexpr char kMagic[8] = {'z', 'd', 'S', 'h', 'm', '0', '1', '\0'};
// The header's bytes at the start of a segment; slots follow.
constexpr size_t kHeaderBytes = 4096;
constexpr size_t kCacheLine = 64;

uint64_t RandomWord() {
  uint64_t word = 0;
  size_t got = 0;
  while (got < sizeof(word)) {
    const ssize_t n = ::getrandom(reinterpret_cast<char*>(&word) + got, sizeof(word) - got, 0);
    if (n < 0 && errno != EINTR)
      throw std::system_error(errno, std::generic_category(), "getrandom");
    if (n > 0) got += static_cast<size_t>(n);
  }
  return word;
}

// The inode of this process's pid namespace (0 if unknown): peers in the same one can watch each
// other's pids.
uint64_t PidNamespace() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

void FutexWake(std::atomic<uint32_t>& word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

void FutexWait(std::atomic<uint32_t>& word, uint32_t seen, std::chrono::nanoseconds timeout) {
  struct timespec ts {};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  // EAGAIN (the word moved on), EINTR and ETIMEDOUT all send the caller back to look.
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

}  // namespace

struct alignas(kCacheLine) SharedMemoryMesh::Header {
  char magic[8];
  uint64_t token;  // random, published beside the segment's name: the segment is the one meant
  int64_t rank;
  int64_t world;
  int64_t pid;
  uint64_t pid_namespace;
  uint64_t bytes;
  // The last piece this rank wrote its contributions for, and holds its region's result (or its
  // own chunk) for. Each on a cache line of its own.
  alignas(kCacheLine) std::atomic<uint64_t> written{0};
  alignas(kCacheLine) std::atomic<uint64_t> reduced{0};
  // Bumped at every publication; sleepers wait on it (futex) and are counted so that a
  // publication with nobody asleep costs no system call.
  alignas(kCacheLine) std::atomic<uint32_t> events{0};
  std::atomic<uint32_t> sleepers{0};
  std::atomic<uint32_t> closed{0};
};
static_assert(sizeof(SharedMemoryMesh::Header) <= kHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "counters shared between processes must be lock-free");
static_assert(SharedMemoryMesh::kSlotBytes % kCacheLine == 0);

namespace {

// A segment being set up, unmapped (and unlinked if this rank created it) unless kept.
struct PendingSegment {
  std::string name;  // set while this rank must still unlink it
  char* base = nullptr;
  size_t bytes = 0;
  ~PendingSegment() {
    if (base != nullptr) ::munmap(base, bytes);
    if (!name.empty()) ::shm_unlink(name.c_str());
  }
};

size_t SegmentBytes() {
  return kHeaderBytes + SharedMemoryMesh::kSlots * SharedMemoryMesh::kSlotBytes;
}

// Creates and maps this rank's segment; false (and nothing left behind) if the host will not.
bool CreateSegment(PendingSegment& segment) {
  const uint64_t a = RandomWord(), b = RandomWord();
  // The creator's pid in the name: an operator can tell whose a name left behind was.
  const std::string name = absl::StrCat("/zerod-", ::getpid(), "-", absl::Hex(a, absl::kZeroPad16),
                                        absl::Hex(b, absl::kZeroPad16));
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  segment.name = name;
  const size_t bytes = SegmentBytes();
  // Reserves the pages now: on a tmpfs that fills up later a touch would raise SIGBUS instead.
  const bool sized = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0;
  void* base =
      sized ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (base == MAP_FAILED) return false;
  segment.base = static_cast<char*>(base);
  segment.bytes = bytes;
  return true;
}

// Maps the segment a peer published as "name:token"; false unless it is there, whole, and its
// header says what was published.
bool MapPeer(const std::string& published, int64_t peer, int64_t world, PendingSegment& segment) {
  const std::vector<std::string> fields = absl::StrSplit(published, ':');
  uint64_t token = 0;
  if (fields.size() != 2 || !absl::SimpleHexAtoi(fields[1], &token)) return false;
  const int fd = ::shm_open(fields[0].c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return false;
  struct stat st {};
  const size_t bytes = SegmentBytes();
  void* base = ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes
                   ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
  ::close(fd);
  if (base == MAP_FAILED) return false;
  segment.base = static_cast<char*>(base);
  segment.bytes = bytes;
  const auto* h = reinterpret_cast<const SharedMemoryMesh::Header*>(base);
  return std::memcmp(h->magic, kMagic, sizeof(kMagic)) == 0 && h->token == token &&
         h->rank == peer && h->world == world && h->bytes == bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SharedMemoryMesh>> SharedMemoryMesh::Connect(
    Store& store, const std::string& key_prefix, int64_t rank, int64_t world, bool enabled,
    absl::Duration timeout) {
  if (world < 2) return nullptr;
  // Regions of whole cache lines, at least one.
  enabled = enabled && kSlotBytes / static_cast<size_t>(world) >= kCacheLine;
  std::vector<PendingSegment> segments(static_cast<size_t>(world));
  PendingSegment& own = segments[static_cast<size_t>(rank)];
  bool ok = enabled && CreateSegment(own);
  std::string published = "-";
  if (ok) {
    auto* h = new (own.base) Header();
    std::memcpy(h->magic, kMagic, sizeof(kMagic));
    h->token = RandomWord();
    h->rank = rank;
    h->world = world;
    h->pid = ::getpid();
    h->pid_namespace = PidNamespace();
    h->bytes = own.bytes;
    published = absl::StrCat(own.name, ":", absl::Hex(h->token));
  }
  const auto key = [&](const char* what, int64_t r) { return absl::StrCat(key_prefix, what, r); };
  if (absl::Status s = store.Set(key("segment/", rank), published); !s.ok()) return s;
  for (int64_t peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    absl::StatusOr<std::string> theirs = store.Get(key("segment/", peer), timeout);
    if (!theirs.ok()) return theirs.status();
    ok = ok && *theirs != "-" && MapPeer(*theirs, peer, world, segments[static_cast<size_t>(peer)]);
  }
  if (absl::Status s = store.Set(key("mapped/", rank), ok ? "1" : "0"); !s.ok()) return s;
  bool everyone = true;
  for (int64_t peer = 0; peer < world; ++peer) {
    absl::StatusOr<std::string> mapped = store.Get(key("mapped/", peer), timeout);
    if (!mapped.ok()) return mapped.status();
    everyone = everyone && *mapped == "1";
  }
  // Every rank has opened it (or never will): the name goes, the memory stays while mapped.
  if (!own.name.empty()) {
    ::shm_unlink(own.name.c_str());
    own.name.clear();
  }
  if (!everyone) return nullptr;  // the pending segments unmap themselves
  // Allocated before the mappings leave the pending segments, which unmap them until then.
  std::unique_ptr<SharedMemoryMesh> mesh(
      new SharedMemoryMesh(rank, world, std::vector<Segment>(static_cast<size_t>(world))));
  const uint64_t pid_namespace = PidNamespace();
  for (int64_t r = 0; r < world; ++r) {
    PendingSegment& p = segments[static_cast<size_t>(r)];
    Segment& s = mesh->segments_[static_cast<size_t>(r)];
    s.base = p.base;
    s.bytes = p.bytes;
    p.base = nullptr;
    const auto* h = reinterpret_cast<const Header*>(s.base);
    if (r != rank && pid_namespace != 0 && h->pid_namespace == pid_namespace &&
        h->pid != ::getpid()) {
      s.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(h->pid), 0));
    }
  }
  return mesh;
}

SharedMemoryMesh::SharedMemoryMesh(int64_t rank, int64_t world, std::vector<Segment> segments)
    : rank_(rank),
      world_(world),
      region_bytes_(kSlotBytes / static_cast<size_t>(world) / kCacheLine * kCacheLine),
      segments_(std::move(segments)) {}

SharedMemoryMesh::~SharedMemoryMesh() {
  if (segments_[static_cast<size_t>(rank_)].base != nullptr) Close();
  for (Segment& s : segments_) {
    if (s.pidfd >= 0) ::close(s.pidfd);
    if (s.base != nullptr) ::munmap(s.base, s.bytes);
  }
}

SharedMemoryMesh::Header& SharedMemoryMesh::HeaderOf(int64_t rank) const {
  return *reinterpret_cast<Header*>(segments_[static_cast<size_t>(rank)].base);
}

char* SharedMemoryMesh::Region(int64_t rank, uint64_t piece, int64_t region) const {
  return segments_[static_cast<size_t>(rank)].base + kHeaderBytes + (piece % kSlots) * kSlotBytes +
         static_cast<size_t>(region) * region_bytes_;
}

void SharedMemoryMesh::Close() {
  HeaderOf(rank_).closed.store(1);
  for (int64_t r = 0; r < world_; ++r) {
    Header& h = HeaderOf(r);
    h.events.fetch_add(1);
    FutexWake(h.events);
  }
}

void SharedMemoryMesh::Publish(std::atomic<uint64_t> Header::*counter, uint64_t value) {
  Header& mine = HeaderOf(rank_);
  (mine.*counter).store(value);
  mine.events.fetch_add(1);
  if (mine.sleepers.load() > 0) FutexWake(mine.events);
}

std::optional<std::string> SharedMemoryMesh::PeerProblem(int64_t peer, const PieceOf& at) const {
  if (HeaderOf(rank_).closed.load() != 0) {
    return "the shared-memory transport was closed on this rank (its communicator was aborted)";
  }
  for (int64_t r = 0; r < world_; ++r) {
    if (r != rank_ && HeaderOf(r).closed.load() != 0) {
      return absl::StrCat("rank ", r,
                          " closed its shared memory (it failed a collective, and its own error "
                          "says why, or it was aborted)");
    }
  }
  const int pidfd = segments_[static_cast<size_t>(peer)].pidfd;
  if (pidfd >= 0) {
    struct pollfd p {
      pidfd, POLLIN, 0
    };
    if (::poll(&p, 1, 0) > 0) {
      return absl::StrCat("rank ", peer, " (pid ", HeaderOf(peer).pid,
                          ") exited during this collective, at piece ", at.index, " of ", at.count);
    }
  }
  return std::nullopt;
}

void SharedMemoryMesh::Await(int64_t peer, std::atomic<uint64_t> Header::*counter, uint64_t value,
                             const PieceOf& at, std::chrono::steady_clock::time_point deadline) {
  Header& h = HeaderOf(peer);
  const auto reached = [&](std::memory_order order) { return (h.*counter).load(order) >= value; };
  if (reached(std::memory_order_acquire)) return;
  // A peer that published what this wait needs and then closed or exited (its part done, its
  // communicator destroyed at the end of the job) has not failed this rank.
  const auto check = [&] {
    std::optional<std::string> problem = PeerProblem(peer, at);
    if (problem.has_value() && !reached(std::memory_order_seq_cst)) {
      throw std::runtime_error(*problem);
    }
  };
  using Clock = std::chrono::steady_clock;
  const Clock::time_point spin_until = std::min(deadline, Clock::now() + kSpin);
  for (int polls = 0; Clock::now() < spin_until; ++polls) {
    ::sched_yield();
    if (reached(std::memory_order_acquire)) return;
    if (polls % 256 == 255) check();
  }
  for (;;) {
    check();
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      if (reached(std::memory_order_acquire)) return;
      throw std::runtime_error(absl::StrCat("rank ", peer, " did not reach piece ", at.index,
                                            " of ", at.count,
                                            " of this collective through shared memory in time"));
    }
    h.sleepers.fetch_add(1);
    const uint32_t seen = h.events.load();
    // Sequentially consistent: either this load sees the publication, or the publisher's load of
    // `sleepers` sees this sleeper and wakes it.
    if (reached(std::memory_order_seq_cst)) {
      h.sleepers.fetch_sub(1);
      return;
    }
    FutexWait(h.events, seen, std::min<Clock::duration>(kSleepSlice, deadline - now));
    h.sleepers.fetch_sub(1);
    if (reached(std::memory_order_acquire)) return;
  }
}

void SharedMemoryMesh::SumRegion(const std::vector<RingPart>& parts, DType dtype, uint64_t piece,
                                 size_t begin, size_t bytes) {
  const size_t element = static_cast<size_t>(DTypeBytes(dtype));
  char* acc = Region(rank_, piece, rank_);
  const auto slot_term = [&](int64_t q) { return Region(q, piece, rank_); };
  // acc = term + this rank's own contribution (from its parts).
  const auto add_own = [&](const char* term) {
    ForEachInStep(parts, rank_, begin, bytes, [&](const char* in_part, size_t n, size_t from) {
      ElementSum(dtype, acc + (from - begin), term + (from - begin), in_part, n / element);
    });
  };
  // Rank order: ((t0 + t1) + t2) + ...; a sum of two is the same bits either way round.
  if (rank_ <= 1) {
    add_own(slot_term(1 - rank_));
  } else {
    ElementSum(dtype, acc, slot_term(0), slot_term(1), bytes / element);
  }
  for (int64_t q = 2; q < world_; ++q) {
    if (q == rank_) {
      add_own(acc);
    } else {
      ElementSum(dtype, acc, acc, slot_term(q), bytes / element);
    }
  }
}

uint64_t SharedMemoryMesh::NextPiece() {
  pieces_run_.fetch_add(1, std::memory_order_relaxed);
  return ++pieces_;
}

std::chrono::steady_clock::time_point SharedMemoryMesh::DeadlineAfter(
    std::chrono::milliseconds timeout) {
  // An "infinite" timeout (absl's, as milliseconds) must not overflow the clock.
  constexpr std::chrono::milliseconds kLongest = std::chrono::hours(24 * 365);
  return std::chrono::steady_clock::now() + std::min(timeout, kLongest);
}

void SharedMemoryMesh::Run(const std::vector<RingPart>& parts, DType dtype, Mode mode,
                           std::chrono::milliseconds timeout) {
  const bool reduce = mode != Mode::kAllGather, gather = mode != Mode::kReduceScatter;
  std::vector<size_t> step(static_cast<size_t>(world_));
  size_t most = 0;
  for (int64_t j = 0; j < world_; ++j) {
    step[static_cast<size_t>(j)] = StepBytes(parts, j);
    most = std::max(most, step[static_cast<size_t>(j)]);
  }
  const size_t pieces = (most + region_bytes_ - 1) / region_bytes_;
  const auto deadline = DeadlineAfter(timeout);
  for (size_t k = 0; k < pieces; ++k) {
    const uint64_t piece = NextPiece();
    const PieceOf at{k + 1, pieces};
    const size_t begin = k * region_bytes_;
    const auto bytes_of = [&](int64_t j) {
      const size_t s = step[static_cast<size_t>(j)];
      return s > begin ? std::min(region_bytes_, s - begin) : size_t{0};
    };
    char* own = Region(rank_, piece, rank_);
    const size_t own_bytes = bytes_of(rank_);
    if (reduce) {
      for (int64_t j = 0; j < world_; ++j) {
        if (j == rank_) continue;
        char* region = Region(rank_, piece, j);
        ForEachInStep(parts, j, begin, bytes_of(j),
                      [&](const char* in_part, size_t n, size_t from) {
                        std::memcpy(region + (from - begin), in_part, n);
                      });
      }
      Publish(&Header::written, piece);
      for (int64_t j = 0; j < world_; ++j) {
        if (j != rank_) Await(j, &Header::written, piece, at, deadline);
      }
      if (own_bytes > 0) SumRegion(parts, dtype, piece, begin, own_bytes);
      ForEachInStep(parts, rank_, begin, own_bytes, [&](char* in_part, size_t n, size_t from) {
        std::memcpy(in_part, own + (from - begin), n);
      });
    } else {
      ForEachInStep(parts, rank_, begin, own_bytes,
                    [&](const char* in_part, size_t n, size_t from) {
                      std::memcpy(own + (from - begin), in_part, n);
                    });
    }
    if (gather) {
      Publish(&Header::reduced, piece);
      for (int64_t i = 1; i < world_; ++i) {
        const int64_t j = (rank_ + i) % world_;
        Await(j, &Header::reduced, piece, at, deadline);
        const char* theirs = Region(j, piece, j);
        ForEachInStep(parts, j, begin, bytes_of(j), [&](char* in_part, size_t n, size_t from) {
          std::memcpy(in_part, theirs + (from - begin), n);
        });
      }
    }
  }
}

void SharedMemoryMesh::ReduceScatter(const std::vector<RingPart>& parts, DType dtype,
                                     bool then_all_gather, std::chrono::milliseconds timeout) {
  Run(parts, dtype, then_all_gather ? Mode::kAllReduce : Mode::kReduceScatter, timeout);
}

void SharedMemoryMesh::Broadcast(char* data, size_t bytes, int64_t root,
                                 std::chrono::milliseconds timeout) {
  const size_t pieces = (bytes + kSlotBytes - 1) / kSlotBytes;
  const auto deadline = DeadlineAfter(timeout);
  for (size_t k = 0; k < pieces; ++k) {
    const uint64_t piece = NextPiece();
    const PieceOf at{k + 1, pieces};
    const size_t begin = k * kSlotBytes, n = std::min(kSlotBytes, bytes - begin);
    char* slot = Region(root, piece, 0);  // the root's whole slot
    if (rank_ == root) {
      std::memcpy(slot, data + begin, n);
    } else {
      Await(root, &Header::reduced, piece, at, deadline);
      std::memcpy(data + begin, slot, n);
    }
    // Every rank past this piece before any goes past the next (see "Two slots are enough").
    Publish(&Header::reduced, piece);
    for (int64_t j = 0; j < world_; ++j) {
      if (j != rank_ && j != root) Await(j, &Header::reduced, piece, at, deadline);
    }
  }
}

void SharedMemoryMesh::AllGather(const std::vector<RingPart>& parts,
                                 std::chrono::milliseconds timeout) {
  Run(parts, DType::kFloat32, Mode::kAllGather, timeout);
}

}  // namespace zerod::comm::internal
