#include "runtime/comm/gloo/gloo_communicator.h"

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/comm/gloo/element_sum.h"
#include "runtime/comm/gloo/host_ranks.h"
#include "runtime/comm/gloo/store_adapter.h"
#include "runtime/common/status_macros.h"
#include "runtime/common/usable_cpus.h"

namespace zerod::comm {

struct GlooCommunicator::Op {
  std::string name;
  int64_t sent = 0;
  int64_t received = 0;
  bool leads_only = false;  // travels on the lead connections alone (Enqueue)
  std::function<void()> body;
  // Under the communicator's mu_: its place in call order, when it was queued, and whether a
  // thread has taken it.
  int64_t index = 0;
  std::chrono::steady_clock::time_point queued_at;
  bool started = false;

  // The first outcome wins: completion, a Work's abort, or the communicator's.
  void Finish(absl::Status s) {
    MutexLock lock(&mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(s);
  }

  absl::Status Wait(absl::Duration timeout) {
    MutexLock lock(&mu_);
    if (!mu_.AwaitWithTimeout([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_; },
                              timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat(name, " did not complete within ", absl::FormatDuration(timeout),
                       " (a rank is missing, slow, or called collectives in another order)"));
    }
    return status_;
  }

  bool done() {
    MutexLock lock(&mu_);
    return done_;
  }

 private:
  Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

namespace {

class GlooWork final : public Work {
 public:
  GlooWork(GlooCommunicator* owner, std::shared_ptr<GlooCommunicator::Op> op)
      : owner_(owner), op_(std::move(op)) {}

  // A finished op is only read (its communicator may be gone: the destructor finishes every op).
  absl::Status Wait(absl::Duration timeout) override {
    if (op_->done()) return op_->Wait(timeout);
    return owner_->RunOrWait(op_, timeout);
  }
  void Start() override {
    if (!op_->done() && owner_->StartsInBackground()) owner_->StartInBackground(op_);
  }
  // The other ranks cannot skip a collective that this one gives up on, so the communicator is
  // aborted with it. A finished op needs nothing (and its communicator may be gone by then: the
  // destructor finishes every op).
  void Abort(const absl::Status& why) override {
    if (!op_->done()) owner_->Abort(why);
  }

 private:
  GlooCommunicator* owner_;
  std::shared_ptr<GlooCommunicator::Op> op_;
};

// Gloo writes with writev, which raises SIGPIPE when the peer has closed the connection (a rank
// declared lost resumes and writes to survivors that tore their transport down): the process
// would die with no message. Ignored, the write fails with EPIPE and the collective with an
// error. A handler the program installed itself is left alone.
void IgnoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// A duration option `name` from 0 to `most`, else InvalidArgument naming it.
absl::Status DurationInRange(const char* name, absl::Duration value, absl::Duration most) {
  if (value >= absl::ZeroDuration() && value <= most) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("gloo: ", name, " must be from 0 to ",
                                                 absl::FormatDuration(most), ", not ",
                                                 absl::FormatDuration(value)));
}

internal::LeadOptions LeadOptionsOf(const GlooOptions& options, int64_t world_size) {
  return {options.lead_all_to_all_max_world, options.split_all_reduce_max_bytes,
          GlooCommunicator::SharedMemoryMinBytes(options, world_size)};
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    std::shared_ptr<Store> store, int64_t rank, int64_t world_size, GlooOptions options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("gloo: rank ", rank, " is out of range for world size ", world_size));
  }
  ZEROD_RETURN_IF_ERROR(
      DurationInRange("unclaimed_grace", options.unclaimed_grace, absl::Hours(24)));
  if (options.caller_spin.has_value()) {
    ZEROD_RETURN_IF_ERROR(DurationInRange("caller_spin", *options.caller_spin, absl::Seconds(1)));
  }
  if (options.shared_memory_min_bytes.value_or(0) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gloo: shared_memory_min_bytes must be 0 or more, not ", *options.shared_memory_min_bytes));
  }
  IgnoreSigpipe();
  try {
    gloo::transport::tcp::attr attr(options.hostname.c_str());
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(rank),
                                                               static_cast<int>(world_size));
    context->setTimeout(Millis(options.timeout));
    internal::GlooStoreAdapter adapter(store, options.timeout);
    context->connectFullMesh(adapter, device);
    std::unique_ptr<internal::LeadMesh> mesh;
    if (world_size > 1) {
      const std::vector<int> peers =
          internal::LeadExchange::PeersOf(rank, world_size, LeadOptionsOf(options, world_size));
      auto connected = internal::LeadMesh::Connect(
          *store, "zerod_leads/", rank, peers, options.hostname,
          internal::LeadExchange::MaxLeadBytes(world_size), options.timeout);
      if (!connected.ok()) {
        return absl::UnavailableError(
            absl::StrCat("gloo: rank ", rank, " of ", world_size,
                         " could not connect: ", connected.status().message()));
      }
      mesh = std::move(*connected);
    }
    auto shm = internal::SharedMemoryMesh::Connect(*store, "zerod_shm/", rank, world_size,
                                                   options.shared_memory, options.timeout);
    if (!shm.ok()) {
      return absl::UnavailableError(
          absl::StrCat("gloo: rank ", rank, " of ", world_size,
                       " could not set up shared memory: ", shm.status().message()));
    }
    // Every rank counts, whatever its options say: the count is a rendezvous.
    auto on_host = internal::RanksSharingHost(*store, "zerod_hosts/", world_size, options.hostname,
                                              options.timeout);
    if (!on_host.ok()) {
      return absl::UnavailableError(
          absl::StrCat("gloo: rank ", rank, " of ", world_size,
                       " could not connect: ", on_host.status().message()));
    }
    // value_or would read the affinity and cgroup files even where the option decides.
    const bool background_start =
        options.background_start.has_value() ? *options.background_start : UsableCpus() > *on_host;
    return std::unique_ptr<GlooCommunicator>(
        new GlooCommunicator(std::move(context), std::move(mesh), std::move(*shm), background_start,
                             rank, world_size, options));
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("gloo: rank ", rank, " of ", world_size, " could not connect: ", e.what()));
  }
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context,
                                   std::unique_ptr<internal::LeadMesh> mesh,
                                   std::unique_ptr<internal::SharedMemoryMesh> shm,
                                   bool background_start, int64_t rank, int64_t world_size,
                                   GlooOptions options)
    : context_(std::move(context)),
      rank_(rank),
      world_size_(world_size),
      options_(std::move(options)),
      leads_(std::move(mesh), rank, world_size, LeadOptionsOf(options_, world_size),
             Millis(options_.timeout), /*shared_memory=*/shm != nullptr),
      shm_(std::move(shm)),
      background_start_(background_start),
      unclaimed_grace_(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          absl::ToChronoNanoseconds(options_.unclaimed_grace))),
      caller_spin_(options_.caller_spin.has_value()
                       ? std::chrono::duration_cast<std::chrono::microseconds>(
                             absl::ToChronoNanoseconds(*options_.caller_spin))
                       : kCallerSpin),
      loop_timer_fd_(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC)) {
  if (loop_timer_fd_ < 0) {
    throw std::system_error(errno, std::generic_category(), "timerfd_create");
  }
  try {
    thread_ = std::thread([this] { Loop(); });
  } catch (...) {
    ::close(loop_timer_fd_);  // the destructor does not run for an object never built
    throw;
  }
}

GlooCommunicator::~GlooCommunicator() {
  Abort(absl::CancelledError("communicator destroyed"));
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    // A caller running a collective (RunOrWait) leaves it at once now the transport is
    // closed; it still touches this object until then.
    mu_.Await([this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !executing_; });
    // The collective thread finds stopping_ at its next look (the queue is empty: Abort took it).
    WakeLoopBy(std::chrono::steady_clock::now());
  }
  thread_.join();
  ::close(loop_timer_fd_);
}

std::unique_ptr<Work> GlooCommunicator::Enqueue(std::string name, int64_t sent, int64_t received,
                                                bool leads_only, std::function<void()> body) {
  auto op = std::make_shared<Op>();
  op->name = absl::StrCat(name, " on rank ", rank_);
  op->sent = sent;
  op->received = received;
  op->leads_only = leads_only;
  op->body = std::move(body);
  {
    MutexLock lock(&mu_);
    if (!aborted_.ok()) {
      op->Finish(aborted_);
      return std::make_unique<GlooWork>(this, op);
    }
    op->index = ++queued_;
    op->queued_at = std::chrono::steady_clock::now();
    queue_.push_back(op);
    // Most often the caller waits at once and runs it itself, which stops the timer again.
    WakeLoopBy(DueAt(*op));
  }
  return std::make_unique<GlooWork>(this, op);
}

void GlooCommunicator::WakeLoopBy(std::chrono::steady_clock::time_point at) {
  if (loop_due_ && *loop_due_ <= at) return;
  // Absolute on the monotonic clock (steady_clock's); a time already past fires at once. Never
  // all zero, which would stop the timer instead.
  const auto since_boot = at.time_since_epoch();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_boot);
  itimerspec spec{};
  spec.it_value.tv_sec = static_cast<time_t>(seconds.count());
  spec.it_value.tv_nsec = static_cast<long>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(since_boot - seconds).count());
  if (spec.it_value.tv_sec == 0 && spec.it_value.tv_nsec == 0) spec.it_value.tv_nsec = 1;
  if (::timerfd_settime(loop_timer_fd_, TFD_TIMER_ABSTIME, &spec, nullptr) != 0) {
    // Only a bad descriptor or value fails it, neither of which this passes: a broken invariant.
    std::perror("zerod: timerfd_settime (the collective thread's timer)");
    std::abort();
  }
  loop_due_ = at;
}

std::chrono::steady_clock::time_point GlooCommunicator::DueAt(const Op& op) const {
  if (stopping_ || op.index <= wanted_through_) return std::chrono::steady_clock::now();
  return op.queued_at + unclaimed_grace_;
}

void GlooCommunicator::DisarmLoop() {
  if (!loop_due_) return;
  const itimerspec stop{};
  (void)::timerfd_settime(loop_timer_fd_, 0, &stop, nullptr);
  loop_due_.reset();
}

void GlooCommunicator::Loop() {
  for (;;) {
    uint64_t fired = 0;
    // Blocks until the timer fires (a firing stopped since makes a look at nothing).
    while (::read(loop_timer_fd_, &fired, sizeof(fired)) < 0 && errno == EINTR) {
    }
    MutexLock lock(&mu_);
    // Whatever is queued now is looked at below; a collective queued later sets the timer again.
    loop_due_.reset();
    while (!queue_.empty() && !executing_) {
      const auto due = DueAt(*queue_.front());
      if (std::chrono::steady_clock::now() < due) {
        // Still the caller's to run: look again when it falls due.
        WakeLoopBy(due);
        break;
      }
      RunFront(/*on_callers_thread=*/false);
    }
    if (stopping_ && queue_.empty()) return;
  }
}

void GlooCommunicator::StartInBackground(const std::shared_ptr<Op>& op) {
  MutexLock lock(&mu_);
  if (op->started || op->index <= wanted_through_ || !aborted_.ok()) return;
  // It and every collective queued before it (they run in call order).
  wanted_through_ = op->index;
  WakeLoopBy(std::chrono::steady_clock::now());
}

absl::Status GlooCommunicator::RunOrWait(const std::shared_ptr<Op>& op, absl::Duration timeout) {
  // The caller runs a collective itself, and any queued before it (they run in call order
  // anyway): waited for at once, it then costs no wake-up of the collective thread and none of the
  // caller, each of which may wait for a scheduler tick where ranks outnumber CPUs
  // (docs/decisions/0015). Only when the caller would wait as long as the collective may take
  // (Gloo's own waits have that timeout).
  const absl::Time deadline = absl::Now() + timeout;
  {
    MutexLock lock(&mu_);
    // Each collective run here may take Gloo's timeout: only while that much of the caller's is
    // left, give or take kCallerOverrun (a collective ahead may have taken much of it).
    const auto may_run = [&] {
      return absl::Now() + options_.timeout <= deadline + kCallerOverrun;
    };
    while (may_run()) {
      const bool turn = mu_.AwaitWithDeadline(
          [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return op->started || !executing_; },
          deadline);
      // Not started with nothing queued: an abort finished it.
      if (!turn || op->started || queue_.empty()) break;
      if (!may_run()) break;
      RunFront(/*on_callers_thread=*/true);
    }
    // A caller that may give up sooner cannot run it (inside Gloo it could not leave before Gloo's
    // timeout): the collective thread runs it at once, with every one queued so far (issued
    // together, as a WorkGroup's, they are waited for one after the other).
    if (!op->started && op->index > wanted_through_ && aborted_.ok()) {
      wanted_through_ = queued_;
      WakeLoopBy(std::chrono::steady_clock::now());
    }
  }
  // Not under mu_: the thread running it takes mu_ to finish it.
  return op->Wait(std::max(deadline - absl::Now(), absl::ZeroDuration()));
}

void GlooCommunicator::RunFront(bool on_callers_thread) {
  std::shared_ptr<Op> op = queue_.front();
  queue_.pop_front();
  op->started = true;
  executing_ = true;
  mu_.Unlock();
  // A caller would only sleep meanwhile; the collective thread runs beside the caller's work.
  const bool spin = on_callers_thread && op->leads_only;
  leads_.SetSpin(spin ? caller_spin_ : std::chrono::microseconds(0));
  absl::Status status;
  try {
    op->body();
  } catch (const gloo::IoException& e) {
    // Most often a peer that failed the collective first (a mismatch it names, say) and closed
    // every connection: this rank sees only the closed connection.
    // Gloo's own timeouts are IoExceptions too ("Timed out waiting ..."): no peer closed those.
    const bool timed_out = absl::StrContains(e.what(), "Timed out");
    status = absl::UnavailableError(absl::StrCat(
        op->name, " failed: ", e.what(),
        timed_out ? ""
                  : " (a peer closed its connection: it failed a collective, and its own error "
                    "says why, or it exited)"));
  } catch (const std::exception& e) {
    status = absl::UnavailableError(absl::StrCat(op->name, " failed: ", e.what()));
  }
  if (!status.ok()) {
    // A collective that failed on one rank cannot complete on the others: closing every
    // connection fails theirs at once instead of at their timeout.
    CloseConnections();
  }
  mu_.Lock();
  executing_ = false;
  if (status.ok()) {
    const std::string key = op->name.substr(0, op->name.find(' '));
    sent_[key] += op->sent;
    received_[key] += op->received;
  } else if (aborted_.ok()) {
    // A broken transport breaks every later collective too.
    aborted_ = status;
  } else {
    status = aborted_;  // the cause (a lost rank), not the closed connection it led to
  }
  // Only now, with Gloo done with the op's buffers, may its waiters free them.
  op->Finish(status);
  // Queued behind it while it ran: the collective thread may have looked and found it running.
  // Nothing queued: the timer set for this one need not fire.
  if (queue_.empty()) {
    DisarmLoop();
  } else {
    WakeLoopBy(DueAt(*queue_.front()));
  }
}

void GlooCommunicator::CloseConnections() {
  // Gloo's TCP transport, when a wait times out, hands an exception to every pair of the context:
  // each closes its socket under the lock its reads run under and wakes every wait pending on it.
  // Once that returns no byte can land in any buffer, and the collective in flight leaves Gloo at
  // once. That call (tcp::Context::signalException) is not reachable from here (Debian's
  // libgloo-dev lacks gloo/common/memory.h, which the tcp headers include), so a wait that is
  // sure to time out makes it. Safe from any thread, as Gloo's own timeouts are.
  leads_.Close();
  if (shm_ != nullptr) shm_->Close();
  char byte = 0;
  std::unique_ptr<gloo::transport::UnboundBuffer> probe = context_->createUnboundBuffer(&byte, 1);
  try {
    (void)probe->waitRecv(std::chrono::milliseconds(1));
  } catch (const std::exception&) {
    // Expected: the timeout this call exists for.
  }
}

void GlooCommunicator::Abort(const absl::Status& why) {
  std::deque<std::shared_ptr<Op>> pending;
  absl::Status cause;
  {
    MutexLock lock(&mu_);
    if (aborted_.ok()) aborted_ = why;
    cause = aborted_;
    pending.swap(queue_);
  }
  // Releasing the waiters of the collective in flight while Gloo still held its buffers let a
  // peer that resumed write into memory its owner had freed. The transport goes first; the
  // collective thread then finishes that op as soon as it leaves Gloo.
  CloseConnections();
  // Gloo does not wake a send (or receive) already waiting on a pair it closed: the collective in
  // flight would sleep until its timeout. Nothing can move through the closed pairs now.
  {
    MutexLock lock(&mu_);
    for (gloo::transport::UnboundBuffer* buffer : watched_) {
      buffer->abortWaitSend();
      buffer->abortWaitRecv();
    }
  }
  // Never started: Gloo never saw their buffers.
  for (auto& op : pending) op->Finish(cause);
}

class GlooCommunicator::WatchedBuffers {
 public:
  WatchedBuffers(GlooCommunicator& owner, std::vector<gloo::transport::UnboundBuffer*> buffers)
      : owner_(owner), buffers_(std::move(buffers)) {
    MutexLock lock(&owner_.mu_);
    if (!owner_.aborted_.ok()) throw std::runtime_error(std::string(owner_.aborted_.message()));
    owner_.watched_.insert(owner_.watched_.end(), buffers_.begin(), buffers_.end());
  }
  ~WatchedBuffers() {
    MutexLock lock(&owner_.mu_);
    std::vector<gloo::transport::UnboundBuffer*>& watched = owner_.watched_;
    for (gloo::transport::UnboundBuffer* b : buffers_) {
      watched.erase(std::remove(watched.begin(), watched.end(), b), watched.end());
    }
  }
  WatchedBuffers(const WatchedBuffers&) = delete;
  WatchedBuffers& operator=(const WatchedBuffers&) = delete;

 private:
  GlooCommunicator& owner_;
  const std::vector<gloo::transport::UnboundBuffer*> buffers_;
};

namespace {

// A ring's wait that Abort woke (false) fails the collective.
void Waited(bool completed, const char* what) {
  if (!completed) throw std::runtime_error(absl::StrCat("the ring's ", what, " was aborted"));
}

}  // namespace

std::map<std::string, int64_t> GlooCommunicator::BytesSent() const {
  MutexLock lock(&mu_);
  return sent_;
}

std::map<std::string, int64_t> GlooCommunicator::BytesReceived() const {
  MutexLock lock(&mu_);
  return received_;
}

internal::CollectiveDescriptor GlooCommunicator::Next(internal::CollectiveKind kind, int64_t count,
                                                      DType dtype, int64_t root) {
  return {++sequence_, kind, count, dtype, root};
}

const char* GlooCommunicator::InlinePayload(int peer, size_t bytes) {
  auto [data, size] = leads_.Payload(peer);
  if (size != bytes) {
    throw std::runtime_error(
        absl::StrCat("rank ", peer, " sent ", size, " bytes inline where ", bytes, " were due"));
  }
  return data;
}

void GlooCommunicator::SumInRankOrder(char* out, const char* mine, int64_t count, DType dtype,
                                      size_t at, size_t payload_bytes) {
  // Every rank adds the contributions in the same order (rank 0's first), so every rank gets
  // the same bits. Rank 0 can add into `out` (its own contribution is first); the others add
  // into rank 0's received copy, which is theirs until the next lead.
  const size_t bytes = static_cast<size_t>(count * DTypeBytes(dtype));
  char* sum = rank_ == 0 ? out : leads_.Payload(0).first + at;
  if (rank_ != 0) InlinePayload(0, payload_bytes);  // checks its size
  for (int64_t q = 1; q < world_size_; ++q) {
    const char* term = q == rank_ ? mine : InlinePayload(static_cast<int>(q), payload_bytes) + at;
    internal::ElementSum(dtype, sum, sum, term, static_cast<size_t>(count));
  }
  if (sum != out) std::memcpy(out, sum, bytes);
}

int64_t GlooCommunicator::SharedMemoryMinBytes(const GlooOptions& options, int64_t world_size) {
  if (options.shared_memory_min_bytes.has_value()) return *options.shared_memory_min_bytes;
  constexpr int64_t kMeasured = static_cast<int64_t>(std::size(kSharedMemoryMinBytes));
  return kSharedMemoryMinBytes[std::clamp<int64_t>(world_size, 0, kMeasured - 1)];
}

GlooCommunicator::AllReduceRoute GlooCommunicator::AllReduceRouteOf(int64_t count, DType dtype,
                                                                    int64_t world_size,
                                                                    const GlooOptions& options,
                                                                    bool shared_memory) {
  const int64_t bytes = count * DTypeBytes(dtype);
  if (shared_memory && world_size > 1 && bytes >= SharedMemoryMinBytes(options, world_size)) {
    return AllReduceRoute::kSharedMemory;
  }
  const bool all_to_all = world_size <= options.lead_all_to_all_max_world;
  const auto fits = [&](size_t bytes_per_peer) {
    return all_to_all && bytes_per_peer <= internal::LeadExchange::MaxInlineBytes(
                                               internal::CollectiveKind::kAllReduce, world_size);
  };
  // Our rings (a reduce-scatter then an all-gather) up to split_all_reduce_max_bytes
  // (docs/decisions/0007). Not when a chunk would be empty (a tiny buffer in a world too large to
  // go inline).
  const internal::Chunks chunks = internal::Chunks::Split(world_size, count, DTypeBytes(dtype));
  const bool splits =
      bytes <= options.split_all_reduce_max_bytes && chunks.bytes(world_size - 1) > 0;
  // Split, with chunks small enough to go inline: the reduce-scatter in the all-reduce's leads,
  // the all-gather in a second exchange. Two rounds instead of the rings' 2 (world - 1) steps,
  // each of which waits for the previous rank; where processes outnumber cores each such wait
  // can take a scheduler tick (docs/decisions/0008).
  const bool two_fit = splits && fits(chunks.max_bytes());
  // In one exchange each rank sends its whole buffer to every other: (world - 2) buffers more
  // than in two. Preferred up to kMaxOneExchangeExtraBytes of that excess (always at 2 ranks).
  if (fits(static_cast<size_t>(bytes)) &&
      (!two_fit || (world_size - 2) * bytes <= static_cast<int64_t>(kMaxOneExchangeExtraBytes))) {
    return AllReduceRoute::kOneExchange;
  }
  if (two_fit) return AllReduceRoute::kTwoExchanges;
  return splits ? AllReduceRoute::kRings : AllReduceRoute::kGloo;
}

std::unique_ptr<Work> GlooCommunicator::AllReduce(void* data, int64_t count, DType dtype) {
  const int64_t bytes = count * DTypeBytes(dtype);
  const internal::Chunks chunks = internal::Chunks::Split(world_size_, count, DTypeBytes(dtype));
  const AllReduceRoute route =
      AllReduceRouteOf(count, dtype, world_size_, options_, UsesSharedMemory());
  const bool shared = route == AllReduceRoute::kSharedMemory;
  const bool direct = route == AllReduceRoute::kOneExchange;
  const bool two_inline = route == AllReduceRoute::kTwoExchanges;
  const bool split = route == AllReduceRoute::kRings;
  // Inline, each rank sends its whole buffer to every other (one exchange instead of a ring's
  // 2 (world - 1) steps); a ring sends 2 (world - 1) / world of it: split, every chunk but its
  // own in the reduce-scatter and every one but its successor's in the all-gather; in two
  // exchanges, every chunk but its own, then its own to every other rank.
  const auto others = [&](int64_t a, int64_t b) {
    return 2 * bytes -
           static_cast<int64_t>(chunks.bytes(a % world_size_) + chunks.bytes(b % world_size_));
  };
  const int64_t own_chunk = static_cast<int64_t>(chunks.bytes(rank_));
  const int64_t two_exchanges = bytes - own_chunk + (world_size_ - 1) * own_chunk;
  // Through shared memory, what the peers read of this rank's: as in two exchanges.
  const int64_t sent = world_size_ == 1       ? 0
                       : direct               ? (world_size_ - 1) * bytes
                       : two_inline || shared ? two_exchanges
                       : split                ? others(rank_, rank_ + 1)
                                              : 2 * (world_size_ - 1) * bytes / world_size_;
  const int64_t received =
      world_size_ == 1 || !split ? sent : others(rank_ + world_size_ - 1, rank_);
  return Enqueue("all_reduce", sent, received, /*leads_only=*/direct || two_inline,
                 [this, data, count, dtype, bytes, shared, direct, split, two_inline, chunks] {
                   const auto lead = Next(internal::CollectiveKind::kAllReduce, count, dtype);
                   if (world_size_ == 1) return;
                   char* own = static_cast<char*>(data);
                   if (direct) {
                     leads_.Exchange(
                         lead, [&](int) { return std::pair<const void*, size_t>(own, bytes); });
                     SumInRankOrder(own, own, count, dtype, 0, static_cast<size_t>(bytes));
                     leads_.Release();
                     return;
                   }
                   if (two_inline) {
                     internal::CollectiveDescriptor first = lead;
                     first.phase = 1;
                     TwoExchangeAllReduce(first, own, chunks, dtype);
                     return;
                   }
                   leads_.Exchange(lead, nullptr);
                   leads_.Release();
                   if (shared) {
                     // Summed in rank order, each chunk on one rank: every rank gets the same bits.
                     shm_->ReduceScatter({{own, chunks}}, dtype, /*then_all_gather=*/true,
                                         Millis(options_.timeout));
                     return;
                   }
                   if (split) {
                     // Each chunk is summed once, on one rank, then copied: every rank gets the
                     // same bits.
                     RingReduceScatterInPieces({{own, chunks}}, dtype, /*then_all_gather=*/true);
                     TrimStaging();
                     return;
                   }
                   gloo::AllreduceOptions opts(context_);
                   opts.setTimeout(Millis(options_.timeout));
                   opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
                   if (dtype == DType::kFloat32) {
                     opts.setOutput(static_cast<float*>(data), static_cast<size_t>(count));
                   } else {
                     opts.setOutput(static_cast<uint16_t*>(data), static_cast<size_t>(count));
                   }
                   opts.setReduceFunction([dtype](void* c, const void* a, const void* b, size_t n) {
                     internal::ElementSum(dtype, c, a, b, n);
                   });
                   gloo::allreduce(opts);
                 });
}

void GlooCommunicator::TwoExchangeAllReduce(const internal::CollectiveDescriptor& lead, char* own,
                                            const internal::Chunks& chunks, DType dtype) {
  // Each peer gets the chunk it owns and sums the world's in rank order (every rank gets the
  // same bits), then sends the sum to every other rank.
  leads_.Exchange(lead, [&](int peer) {
    return std::pair<const void*, size_t>(own + chunks.offset(peer), chunks.bytes(peer));
  });
  char* mine = own + chunks.offset(rank_);
  const size_t mine_bytes = chunks.bytes(rank_);
  SumInRankOrder(mine, mine, static_cast<int64_t>(mine_bytes) / DTypeBytes(dtype), dtype, 0,
                 mine_bytes);
  leads_.Release();
  internal::CollectiveDescriptor second = lead;
  second.phase = 2;
  leads_.Exchange(second, [&](int) { return std::pair<const void*, size_t>(mine, mine_bytes); });
  for (int peer : leads_.peers()) {
    std::memcpy(own + chunks.offset(peer), InlinePayload(peer, chunks.bytes(peer)),
                chunks.bytes(peer));
  }
  leads_.Release();
}

namespace {

using internal::ForEachInStep;
using internal::MaxStepBytes;
using internal::PackRange;
using internal::StepBytes;

// Copies chunk `i` of every part into `out`, end to end.
void PackChunk(const std::vector<GlooCommunicator::RingPart>& parts, int64_t i, char* out) {
  PackRange(parts, i, 0, StepBytes(parts, i), out);
}

// The reverse: chunk `i` of every part from `in`.
void UnpackChunk(const std::vector<GlooCommunicator::RingPart>& parts, int64_t i, const char* in) {
  for (const auto& part : parts) {
    std::memcpy(part.data + part.chunks.offset(i), in, part.chunks.bytes(i));
    in += part.chunks.bytes(i);
  }
}

// Parts whose chunks are at least this large go round one ring together, each sent from (and an
// all-gather's received into) its own buffer as messages of its own: a message more costs them
// less than packing's copies. Smaller ones are packed, where a message each would cost more than
// the copy (docs/decisions/0009).
constexpr size_t kInPlaceRingBytes = size_t{256} << 10;
// Smaller parts are packed end to end, up to this many bytes of them a step in a ring.
constexpr size_t kPackedRingBytes = size_t{16} << 20;
// A reduce-scatter's ring sends a part in place, or a packed step, in pieces of at most this many
// bytes (a multiple of every element size), each summed while the next arrives; the size that beat
// smaller and larger pieces (docs/decisions/0009).
constexpr size_t kRingPieceBytes = size_t{1} << 20;
static_assert(kRingPieceBytes % 8 == 0, "a piece must hold whole elements of every dtype");
// A message of `bytes` cut into pieces of `size` (the last one shorter).
struct Pieces {
  size_t size;
  explicit Pieces(size_t piece_size) : size(piece_size) {}
  size_t Count(size_t bytes) const { return (bytes + size - 1) / size; }
  size_t Bytes(size_t bytes, size_t k) const { return std::min(size, bytes - k * size); }
};
// A chain broadcast forwards the buffer in pieces of this many bytes: a rank sends one on while the
// next arrives (docs/decisions/0012).
constexpr size_t kChainPieceBytes = size_t{1} << 20;
// Staging is kept between collectives up to this size each (a larger one is freed at the end).
constexpr size_t kKeptStagingBytes = size_t{16} << 20;

// Parts sent from and received into their own memory, chunk by chunk in pieces: a Gloo buffer
// per part, and what was posted on each and not yet waited for.
class InPlaceParts {
 public:
  // Where one piece of a chunk sits: which part, where in it, how many bytes.
  struct Piece {
    size_t part, at, bytes;
  };

  InPlaceParts(gloo::Context& context, const std::vector<GlooCommunicator::RingPart>& parts,
               Pieces pieces)
      : parts_(parts), pieces_(pieces), sends_(parts.size()), receives_(parts.size()) {
    for (const auto& part : parts) {
      buffers_.push_back(context.createUnboundBuffer(part.data, part.chunks.total_bytes()));
    }
  }

  // For WatchedBuffers.
  std::vector<gloo::transport::UnboundBuffer*> buffers() const {
    std::vector<gloo::transport::UnboundBuffer*> out;
    for (const auto& b : buffers_) out.push_back(b.get());
    return out;
  }
  // Chunk `i`'s pieces of every part, in order.
  std::vector<Piece> Of(int64_t i) const {
    std::vector<Piece> out;
    for (size_t p = 0; p < parts_.size(); ++p) {
      const internal::Chunks& c = parts_[p].chunks;
      for (size_t k = 0; k < pieces_.Count(c.bytes(i)); ++k) {
        out.push_back({p, c.offset(i) + k * pieces_.size, pieces_.Bytes(c.bytes(i), k)});
      }
    }
    return out;
  }
  void Send(const Piece& p, int peer, uint64_t slot) {
    buffers_[p.part]->send(peer, slot, p.at, p.bytes);
    ++sends_[p.part];
  }
  void Receive(const Piece& p, int peer, uint64_t slot) {
    buffers_[p.part]->recv(peer, slot, p.at, p.bytes);
    ++receives_[p.part];
  }
  // Chunk `i`'s pieces of every part to `peer` (or from it) on `slot`.
  void Post(bool send, int peer, uint64_t slot, int64_t i) {
    for (const Piece& p : Of(i)) send ? Send(p, peer, slot) : Receive(p, peer, slot);
  }
  // Waits for everything posted.
  void WaitPosted(std::chrono::milliseconds timeout) {
    for (size_t p = 0; p < parts_.size(); ++p) {
      for (; receives_[p] > 0; --receives_[p]) Waited(buffers_[p]->waitRecv(timeout), "receive");
      for (; sends_[p] > 0; --sends_[p]) Waited(buffers_[p]->waitSend(timeout), "send");
    }
  }

 private:
  const std::vector<GlooCommunicator::RingPart>& parts_;
  const Pieces pieces_;
  std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> buffers_;
  std::vector<size_t> sends_, receives_;  // posted on each part's buffer, not yet waited for
};

// A group's parts: those that go round in place (kInPlaceRingBytes), and the rest.
struct SplitParts {
  std::vector<GlooCommunicator::RingPart> in_place, small;
  explicit SplitParts(const std::vector<GlooCommunicator::RingPart>& parts) {
    for (const auto& part : parts) {
      (part.chunks.max_bytes() >= kInPlaceRingBytes ? in_place : small).push_back(part);
    }
  }
};

// The packed rings small parts go round in, one after the other: runs of up to kPackedRingBytes
// a step. The same on every rank (the leads checked the parts' counts).
std::vector<std::vector<GlooCommunicator::RingPart>> PackedRings(
    const std::vector<GlooCommunicator::RingPart>& parts) {
  std::vector<std::vector<GlooCommunicator::RingPart>> rings;
  std::vector<GlooCommunicator::RingPart> packed;
  size_t packed_bytes = 0;
  for (const auto& part : parts) {
    const size_t bytes = part.chunks.max_bytes();
    if (packed_bytes + bytes > kPackedRingBytes) {
      rings.push_back(std::move(packed));
      packed.clear();
      packed_bytes = 0;
    }
    packed.push_back(part);
    packed_bytes += bytes;
  }
  if (!packed.empty()) rings.push_back(std::move(packed));
  return rings;
}

}  // namespace

char* GlooCommunicator::Staging(int which, size_t bytes) {
  // Kept between collectives (only the running one uses them): a fresh megabyte per collective
  // cost page faults and zeroing on every step. At most kPackedRingBytes (a packed ring's step),
  // two kRingPieceBytes (a reduce-scatter's pieces, by turns) or world x what goes inline to a
  // peer (an inline group's payloads: 2 MiB at 2 ranks, 256 KiB at 3-4, 64 KiB beyond).
  std::vector<char>& buffer = staging_[which];
  if (buffer.size() < bytes) {
    buffer.reserve(bytes);  // exactly: resize alone may double, past what TrimStaging keeps
    buffer.resize(bytes);
  }
  return buffer.data();
}

void GlooCommunicator::TrimStaging() {
  for (std::vector<char>& buffer : staging_) {
    if (buffer.capacity() > kKeptStagingBytes) std::vector<char>().swap(buffer);
  }
}

void GlooCommunicator::RingReduceScatter(const std::vector<RingPart>& parts, DType dtype) {
  const SplitParts split(parts);
  if (!split.in_place.empty()) RingReduceScatterInPieces(split.in_place, dtype);
  for (const std::vector<RingPart>& ring : PackedRings(split.small)) {
    RingReduceScatterPacked(ring, dtype);
  }
  TrimStaging();
}

void GlooCommunicator::RingAllGather(const std::vector<RingPart>& parts) {
  // An all-gather needs no scratch for the parts that go in place.
  const SplitParts split(parts);
  RingAllGatherInPlace(split.in_place);
  for (const std::vector<RingPart>& ring : PackedRings(split.small)) RingAllGatherOnce(ring);
  TrimStaging();
}

void GlooCommunicator::ChainBroadcast(char* data, size_t bytes, int64_t root) {
  const int64_t w = world_size_, r = rank_;
  const int next = static_cast<int>((r + 1) % w), prev = static_cast<int>((r + w - 1) % w);
  const bool receives = r != root, forwards = next != root;
  const auto timeout = Millis(options_.timeout);
  auto whole = context_->createUnboundBuffer(data, bytes);
  const WatchedBuffers watched(*this, {whole.get()});
  const uint64_t slot = static_cast<uint64_t>(context_->nextSlot());
  const Pieces pieces(kChainPieceBytes);
  // Every receive posted at once (they complete in order: one sender, one connection); each piece
  // goes on as soon as it is in.
  if (receives) {
    for (size_t i = 0; i < pieces.Count(bytes); ++i)
      whole->recv(prev, slot, i * pieces.size, pieces.Bytes(bytes, i));
  }
  for (size_t i = 0; i < pieces.Count(bytes); ++i) {
    if (receives) Waited(whole->waitRecv(timeout), "receive");
    if (forwards) whole->send(next, slot, i * pieces.size, pieces.Bytes(bytes, i));
  }
  if (forwards) {
    for (size_t i = 0; i < pieces.Count(bytes); ++i) Waited(whole->waitSend(timeout), "send");
  }
}

void GlooCommunicator::RingAllGatherInPlace(const std::vector<RingPart>& parts) {
  if (parts.empty()) return;
  const int64_t w = world_size_, r = rank_;
  const int next = static_cast<int>((r + 1) % w), prev = static_cast<int>((r + w - 1) % w);
  const auto timeout = Millis(options_.timeout);
  // In pieces, so a rank forwards one while the next arrives, as the chain broadcast does; a chunk
  // as one message is slower from a few MiB (docs/decisions/0009).
  InPlaceParts in_place(*context_, parts, Pieces(kRingPieceBytes));
  const WatchedBuffers watched(*this, in_place.buffers());
  // A slot of its own for each part: a part's messages can match only its own receives.
  std::vector<uint64_t> slots;
  for (size_t i = 0; i < parts.size(); ++i) {
    slots.push_back(static_cast<uint64_t>(context_->nextSlot()));
  }
  // Step s forwards chunk r-s and receives chunk r-s-1 straight into place, every part at once.
  for (int64_t s = 0; s < w - 1; ++s) {
    for (const InPlaceParts::Piece& p : in_place.Of((r - s - 1 + w) % w)) {
      in_place.Receive(p, prev, slots[p.part]);
    }
    for (const InPlaceParts::Piece& p : in_place.Of((r - s + w) % w)) {
      in_place.Send(p, next, slots[p.part]);
    }
    in_place.WaitPosted(timeout);
  }
}

const char* GlooCommunicator::Packed(const std::vector<RingPart>& parts, int64_t chunk,
                                     int64_t slot_in_staging) {
  if (parts.empty()) return nullptr;
  if (parts.size() == 1) return parts[0].data + parts[0].chunks.offset(chunk);
  const size_t bytes = StepBytes(parts, chunk);
  char* out = Staging(0, static_cast<size_t>(world_size_) * bytes) + slot_in_staging * bytes;
  PackChunk(parts, chunk, out);
  return out;
}

void GlooCommunicator::RingReduceScatterPacked(const std::vector<RingPart>& parts, DType dtype) {
  if (parts.empty()) return;
  if (parts.size() == 1) return RingReduceScatterInPieces(parts, dtype);
  const int64_t w = world_size_, r = rank_;
  // Several parts: each step's chunks packed end to end (a message per part costs more than the
  // copy), and the packed step sent in pieces as in RingReduceScatterInPieces, each summed into
  // its parts while the next arrives rather than once the whole step is in (docs/decisions/0009).
  const size_t step_bytes = std::max<size_t>(MaxStepBytes(parts, w), 1);
  const Pieces pieces(std::min(step_bytes, kRingPieceBytes));
  char* const both = Staging(0, 2 * pieces.size);
  char* const scratch[2] = {both, both + pieces.size};
  char* const outgoing = Staging(1, step_bytes);
  std::unique_ptr<gloo::transport::UnboundBuffer> incoming[2] = {
      context_->createUnboundBuffer(scratch[0], pieces.size),
      context_->createUnboundBuffer(scratch[1], pieces.size)};
  auto source = context_->createUnboundBuffer(outgoing, step_bytes);
  const WatchedBuffers watched(*this, {source.get(), incoming[0].get(), incoming[1].get()});
  const int next = static_cast<int>((r + 1) % w), prev = static_cast<int>((r + w - 1) % w);
  const uint64_t slot = static_cast<uint64_t>(context_->nextSlot());
  const auto timeout = Millis(options_.timeout);
  // Steps as in RingReduceScatterInPieces. Sender and receiver of a chunk cut its packed step
  // alike (the parts' counts are the same on every rank), and both skip an empty one.
  for (int64_t s = 0; s < w - 1; ++s) {
    const int64_t send_chunk = (r - s - 1 + 2 * w) % w;
    const int64_t recv_chunk = (r - s - 2 + 2 * w) % w;
    const size_t send_bytes = StepBytes(parts, send_chunk);
    const size_t recv_bytes = StepBytes(parts, recv_chunk);
    const size_t receives = pieces.Count(recv_bytes), sends = pieces.Count(send_bytes);
    if (receives > 0) incoming[0]->recv(prev, slot, 0, pieces.Bytes(recv_bytes, 0));
    // Each piece leaves as soon as it is packed.
    for (size_t k = 0; k < sends; ++k) {
      const size_t at = k * pieces.size, bytes = pieces.Bytes(send_bytes, k);
      PackRange(parts, send_chunk, at, bytes, outgoing);
      source->send(next, slot, at, bytes);
    }
    for (size_t k = 0; k < receives; ++k) {
      if (k + 1 < receives) {
        incoming[(k + 1) % 2]->recv(prev, slot, 0, pieces.Bytes(recv_bytes, k + 1));
      }
      Waited(incoming[k % 2]->waitRecv(timeout), "receive");
      const size_t at = k * pieces.size;
      const char* term = scratch[k % 2];
      ForEachInStep(parts, recv_chunk, at, pieces.Bytes(recv_bytes, k),
                    [&](char* in_part, size_t n, size_t from) {
                      internal::ElementSum(dtype, in_part, in_part, term + (from - at),
                                           n / static_cast<size_t>(DTypeBytes(dtype)));
                    });
    }
    for (size_t k = 0; k < sends; ++k) Waited(source->waitSend(timeout), "send");
  }
}

void GlooCommunicator::RingReduceScatterInPieces(const std::vector<RingPart>& parts, DType dtype,
                                                 bool then_all_gather) {
  const int64_t w = world_size_, r = rank_;
  // Sent straight from the parts' buffers; what arrives lands in two scratch pieces by turns, so a
  // piece is summed while the next one arrives. Two pieces, not a whole chunk: a chunk-sized
  // scratch would be faulted in afresh per collective.
  size_t largest = 1;
  for (const RingPart& part : parts) largest = std::max(largest, part.chunks.max_bytes());
  const Pieces pieces(std::min(largest, kRingPieceBytes));
  char* const both = Staging(0, 2 * pieces.size);
  char* const scratch[2] = {both, both + pieces.size};
  std::unique_ptr<gloo::transport::UnboundBuffer> incoming[2] = {
      context_->createUnboundBuffer(scratch[0], pieces.size),
      context_->createUnboundBuffer(scratch[1], pieces.size)};
  // The reduce-scatter's sends, and the all-gather's sends and receives (into place).
  InPlaceParts in_place(*context_, parts, pieces);
  std::vector<gloo::transport::UnboundBuffer*> watch = in_place.buffers();
  watch.push_back(incoming[0].get());
  watch.push_back(incoming[1].get());
  const WatchedBuffers watched(*this, std::move(watch));
  const int next = static_cast<int>((r + 1) % w), prev = static_cast<int>((r + w - 1) % w);
  const uint64_t slot = static_cast<uint64_t>(context_->nextSlot());
  const uint64_t gather_slot = then_all_gather ? static_cast<uint64_t>(context_->nextSlot()) : 0;
  const auto timeout = Millis(options_.timeout);
  // Step s sends the partial sum of chunk r-s-1 and adds the arriving chunk r-s-2; after w-1
  // steps chunk r holds every rank's contribution. Every part's pieces go and arrive in order (one
  // slot, one peer each way: Gloo matches a slot's messages first come, first served, whichever
  // buffer they are from), and sender and receiver cut them alike.
  for (int64_t s = 0; s < w - 1; ++s) {
    const int64_t send_chunk = (r - s - 1 + 2 * w) % w;
    const int64_t recv_chunk = (r - s - 2 + 2 * w) % w;  // r at the last step
    const bool last = s == w - 2;
    const std::vector<InPlaceParts::Piece> arriving = in_place.Of(recv_chunk);
    // The all-gather's first step overlaps the reduce-scatter's last: chunk r-1 arrives into
    // place (it left at step 0: by the time the predecessor sends it back summed, every piece of
    // it that this rank sent has arrived there), and chunk r goes on piece by piece as it is
    // summed.
    if (then_all_gather && last) in_place.Post(false, prev, gather_slot, (r + w - 1) % w);
    if (!arriving.empty()) incoming[0]->recv(prev, slot, 0, arriving[0].bytes);
    in_place.Post(true, next, slot, send_chunk);
    for (size_t k = 0; k < arriving.size(); ++k) {
      if (k + 1 < arriving.size()) {
        incoming[(k + 1) % 2]->recv(prev, slot, 0, arriving[k + 1].bytes);
      }
      Waited(incoming[k % 2]->waitRecv(timeout), "receive");
      const InPlaceParts::Piece& in = arriving[k];
      char* target = parts[in.part].data + in.at;
      internal::ElementSum(dtype, target, target, scratch[k % 2],
                           in.bytes / static_cast<size_t>(DTypeBytes(dtype)));
      if (then_all_gather && last) in_place.Send(in, next, gather_slot);
    }
    in_place.WaitPosted(timeout);
  }
  if (!then_all_gather) return;
  // The all-gather's other steps, whole chunks into place: step g forwards chunk r-g and receives
  // chunk r-g-1.
  for (int64_t g = 1; g < w - 1; ++g) {
    in_place.Post(false, prev, gather_slot, (r - g - 1 + 2 * w) % w);
    in_place.Post(true, next, gather_slot, (r - g + 2 * w) % w);
    in_place.WaitPosted(timeout);
  }
}

void GlooCommunicator::RingAllGatherOnce(const std::vector<RingPart>& parts) {
  if (parts.size() <= 1) return RingAllGatherInPlace(parts);
  const int64_t w = world_size_, r = rank_;
  const int next = static_cast<int>((r + 1) % w), prev = static_cast<int>((r + w - 1) % w);
  const uint64_t slot = static_cast<uint64_t>(context_->nextSlot());
  const auto timeout = Millis(options_.timeout);
  // Several parts: one message per step, packed end to end. What arrives at step s is forwarded
  // at step s+1, so the two staging buffers swap roles every step.
  const size_t step_bytes = std::max<size_t>(MaxStepBytes(parts, w), 1);
  char* const stage[2] = {Staging(0, step_bytes), Staging(1, step_bytes)};
  std::unique_ptr<gloo::transport::UnboundBuffer> buffers[2] = {
      context_->createUnboundBuffer(stage[0], step_bytes),
      context_->createUnboundBuffer(stage[1], step_bytes)};
  const WatchedBuffers watched(*this, {buffers[0].get(), buffers[1].get()});
  PackChunk(parts, r, stage[0]);
  for (int64_t s = 0; s < w - 1; ++s) {
    const int64_t send_chunk = (r - s + w) % w;
    const int64_t recv_chunk = (r - s - 1 + w) % w;
    const size_t send_bytes = StepBytes(parts, send_chunk);
    const size_t recv_bytes = StepBytes(parts, recv_chunk);
    gloo::transport::UnboundBuffer& out = *buffers[s % 2];
    gloo::transport::UnboundBuffer& in = *buffers[(s + 1) % 2];
    if (recv_bytes > 0) in.recv(prev, slot, 0, recv_bytes);
    if (send_bytes > 0) out.send(next, slot, 0, send_bytes);
    if (recv_bytes > 0) Waited(in.waitRecv(timeout), "receive");
    if (send_bytes > 0) Waited(out.waitSend(timeout), "send");
    UnpackChunk(parts, recv_chunk, stage[(s + 1) % 2]);
  }
}

namespace {

// What a grouped collective over `buffers` moves to each peer (its chunk of every buffer) and
// the chunk counts its lead names.
struct GroupShape {
  int64_t chunk_count = 0;  // of every buffer together
  std::vector<int64_t> counts;
  size_t peer_bytes = 0;

  GroupShape(const std::vector<ChunkedBuffer>& buffers, DType dtype) {
    for (const ChunkedBuffer& b : buffers) {
      counts.push_back(b.chunk_count);
      chunk_count += b.chunk_count;
      peer_bytes += static_cast<size_t>(b.chunk_count * DTypeBytes(dtype));
    }
  }
};

}  // namespace

internal::CollectiveDescriptor GlooCommunicator::NextGroup(internal::CollectiveKind kind,
                                                           const std::vector<int64_t>& counts,
                                                           int64_t total, DType dtype) {
  internal::CollectiveDescriptor d = Next(kind, total, dtype);
  d.buffers = static_cast<int64_t>(counts.size());
  if (counts.size() != 1) d.buffers_digest = internal::DigestOfCounts(counts);
  return d;
}

std::vector<GlooCommunicator::RingPart> GlooCommunicator::RingParts(
    const std::vector<ChunkedBuffer>& buffers, DType dtype) const {
  std::vector<RingPart> parts;
  for (const ChunkedBuffer& b : buffers) {
    if (b.chunk_count == 0) continue;  // on every rank: the leads checked the counts
    parts.push_back({static_cast<char*>(b.data),
                     internal::Chunks::Even(world_size_, b.chunk_count, DTypeBytes(dtype))});
  }
  return parts;
}

std::unique_ptr<Work> GlooCommunicator::ReduceScatter(void* data, int64_t chunk_count,
                                                      DType dtype) {
  return ReduceScatterGroup({{data, chunk_count}}, dtype);
}

std::unique_ptr<Work> GlooCommunicator::EnqueueGroup(const char* name,
                                                     internal::CollectiveKind kind,
                                                     const std::vector<ChunkedBuffer>& buffers,
                                                     DType dtype, GroupBody body) {
  const GroupShape shape(buffers, dtype);
  const int64_t moved = (world_size_ - 1) * static_cast<int64_t>(shape.peer_bytes);
  const bool shared = ViaSharedMemory(world_size_ * static_cast<int64_t>(shape.peer_bytes));
  const bool direct = !shared && leads_.CarriesInline(kind, shape.peer_bytes);
  return Enqueue(name, moved, moved, /*leads_only=*/direct,
                 [this, kind, buffers, shape, dtype, shared, direct, body] {
                   const auto lead = NextGroup(kind, shape.counts, shape.chunk_count, dtype);
                   if (world_size_ == 1) return;
                   const std::vector<RingPart> parts = RingParts(buffers, dtype);
                   if (shared) {
                     leads_.Exchange(lead, nullptr);
                     leads_.Release();
                     if (kind == internal::CollectiveKind::kReduceScatter) {
                       shm_->ReduceScatter(parts, dtype, /*then_all_gather=*/false,
                                           Millis(options_.timeout));
                     } else {
                       shm_->AllGather(parts, Millis(options_.timeout));
                     }
                   } else if (direct) {
                     body(lead, parts, shape.peer_bytes);
                   } else {
                     leads_.Exchange(lead, nullptr);
                     leads_.Release();
                     body(std::nullopt, parts, shape.peer_bytes);
                   }
                 });
}

std::unique_ptr<Work> GlooCommunicator::ReduceScatterGroup(
    const std::vector<ChunkedBuffer>& buffers, DType dtype) {
  return EnqueueGroup(
      "reduce_scatter", internal::CollectiveKind::kReduceScatter, buffers, dtype,
      [this, dtype](const std::optional<internal::CollectiveDescriptor>& inline_lead,
                    const std::vector<RingPart>& parts, size_t peer_bytes) {
        if (!inline_lead) return RingReduceScatter(parts, dtype);
        // Each peer gets the chunk it owns of every buffer and sums the world's in rank order.
        leads_.Exchange(*inline_lead, [&](int peer) {
          return std::pair<const void*, size_t>(Packed(parts, peer, peer), peer_bytes);
        });
        size_t at = 0;
        for (const RingPart& part : parts) {
          char* mine = part.data + part.chunks.offset(rank_);
          SumInRankOrder(mine, mine, part.chunks.per_chunk, dtype, at, peer_bytes);
          at += part.chunks.bytes(rank_);
        }
        leads_.Release();
      });
}

std::unique_ptr<Work> GlooCommunicator::AllGather(void* data, int64_t chunk_count, DType dtype) {
  return AllGatherGroup({{data, chunk_count}}, dtype);
}

std::unique_ptr<Work> GlooCommunicator::AllGatherGroup(const std::vector<ChunkedBuffer>& buffers,
                                                       DType dtype) {
  return EnqueueGroup("all_gather", internal::CollectiveKind::kAllGather, buffers, dtype,
                      [this](const std::optional<internal::CollectiveDescriptor>& inline_lead,
                             const std::vector<RingPart>& parts, size_t peer_bytes) {
                        if (!inline_lead) return RingAllGather(parts);
                        // This rank's chunk of every buffer to every peer.
                        const char* mine = Packed(parts, rank_, 0);
                        leads_.Exchange(*inline_lead, [&](int) {
                          return std::pair<const void*, size_t>(mine, peer_bytes);
                        });
                        for (int peer : leads_.peers())
                          UnpackChunk(parts, peer, InlinePayload(peer, peer_bytes));
                        leads_.Release();
                      });
}

std::unique_ptr<Work> GlooCommunicator::Broadcast(void* data, int64_t count, DType dtype,
                                                  int64_t root) {
  const int64_t bytes = count * DTypeBytes(dtype);
  const bool is_root = root == rank_;
  const auto route = leads_.RouteOf(static_cast<size_t>(bytes));
  const bool direct = route == internal::LeadExchange::BroadcastRoute::kInline;
  const bool chain = route == internal::LeadExchange::BroadcastRoute::kChain;
  const bool shared = route == internal::LeadExchange::BroadcastRoute::kSharedMemory;
  // Along the chain each rank but the root's predecessor sends the buffer once, to its successor;
  // otherwise the root sends it to every other rank (inline), or is counted as if it did (tree,
  // shared memory: every other rank reads it from the root's segment).
  const bool sends_once = chain && (rank_ + 1) % world_size_ != root;
  const int64_t sent = chain ? (sends_once ? bytes : 0) : is_root ? (world_size_ - 1) * bytes : 0;
  return Enqueue(
      "broadcast", sent, is_root ? 0 : bytes, /*leads_only=*/direct,
      [this, data, count, dtype, bytes, root, is_root, direct, chain, shared] {
        const auto lead = Next(internal::CollectiveKind::kBroadcast, count, dtype, root);
        if (world_size_ == 1) return;
        if (root < 0 || root >= world_size_) {
          throw std::invalid_argument(
              absl::StrCat("no rank ", root, " to broadcast from (", world_size_, " ranks)"));
        }
        const size_t size = static_cast<size_t>(bytes);
        if (direct) {
          leads_.Exchange(lead, [&](int) {
            return is_root ? std::pair<const void*, size_t>(data, size)
                           : std::pair<const void*, size_t>(nullptr, 0);
          });
          if (!is_root && size > 0) {
            std::memcpy(data, InlinePayload(static_cast<int>(root), size), size);
          }
          leads_.Release();
          return;
        }
        // Too large to go inline: along the chain, each receiver checked the lead of
        // its predecessor, which sends it the data; for Gloo's tree, every rank's lead
        // reached every other and was checked (all-to-all), so every rank posts Gloo's
        // receives of one size.
        leads_.Exchange(lead, nullptr);
        leads_.Release();
        if (bytes == 0) return;
        if (shared) {
          shm_->Broadcast(static_cast<char*>(data), size, root, Millis(options_.timeout));
          return;
        }
        if (chain) {
          ChainBroadcast(static_cast<char*>(data), size, root);
          return;
        }
        gloo::BroadcastOptions opts(context_);
        opts.setTimeout(Millis(options_.timeout));
        opts.setRoot(static_cast<int>(root));
        opts.setOutput(static_cast<char*>(data), size);
        gloo::broadcast(opts);
      });
}

std::unique_ptr<Work> GlooCommunicator::Barrier() {
  return Enqueue("barrier", 0, 0, /*leads_only=*/leads_.all_to_all(), [this] {
    const auto lead = Next(internal::CollectiveKind::kBarrier, 0, DType::kFloat32);
    if (world_size_ == 1) return;
    leads_.Exchange(lead, nullptr);
    leads_.Release();
    // Leads from every other rank are a barrier already; from the neighbours only, they are not.
    if (leads_.all_to_all()) return;
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(Millis(options_.timeout));
    gloo::barrier(opts);
  });
}

}  // namespace zerod::comm
