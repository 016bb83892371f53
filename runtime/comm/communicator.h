#ifndef ZEROD_RUNTIME_COMM_COMMUNICATOR_H_
#define ZEROD_RUNTIME_COMM_COMMUNICATOR_H_

// Communicator: the collectives the engine needs, with Gloo (host memory) and NCCL (device
// memory) behind the same interface, shaped like c10d's Backend and Work.
//
// SPMD contract: every rank of the group calls the same collectives in the same order with the
// same counts and dtypes. A rank that breaks it would hang or corrupt data in plain Gloo/NCCL;
// here every collective has a timeout, the Gloo backend checks each collective against the other
// ranks' in its first message (gloo/lead_exchange.h), and the engine's CollectiveLog compares
// whole sequences.
//
// Collectives are asynchronous and run in the order they were called; each returns a Work. The
// buffers must stay alive and untouched until Wait returns anything but DEADLINE_EXCEEDED: once
// it has returned OK or an error, no transfer can land in them any more (an aborted collective
// reports its error only after its transport can no longer write). Sums of bf16/fp16 round to
// the element type after every addition, as NCCL does.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/common/dtype.h"

namespace zerod::comm {

class Work {
 public:
  virtual ~Work() = default;
  // OK when the collective completed; DEADLINE_EXCEEDED when `timeout` passed first (the
  // collective may still be running); the abort reason when the communicator was aborted; or the
  // collective's own failure (UNAVAILABLE, naming it), which is also what a collective that ran
  // past the communicator's timeout gives when the waiting thread ran it itself (Gloo).
  [[nodiscard]] virtual absl::Status Wait(absl::Duration timeout) = 0;
  // Asks for the collective to start in the background now: for one issued to overlap other work
  // and waited for later. Without it a backend may leave it to the first Wait (the Gloo
  // communicator runs it on the waiting thread, and in the background only after a grace period);
  // NCCL's start at once anyway. A backend may decline where running in the background would cost
  // more than it overlaps (Gloo: GlooOptions::background_start).
  virtual void Start() {}
  // Gives up on this collective. The other ranks cannot skip it, so unless it has completed the
  // communicator is aborted with `why` (see Communicator::Abort).
  virtual void Abort(const absl::Status& why) = 0;
};

// One buffer of a grouped reduce-scatter or all-gather: world_size chunks of `chunk_count`
// elements, as ReduceScatter and AllGather take.
struct ChunkedBuffer {
  void* data = nullptr;
  int64_t chunk_count = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;

  // In place: every rank ends with the element-wise sum.
  virtual std::unique_ptr<Work> AllReduce(void* data, int64_t count, DType dtype) = 0;
  // `data` holds world_size chunks of `chunk_count` elements. Afterwards chunk `rank` holds the
  // sum of every rank's chunk `rank`; the other chunks are scratch.
  virtual std::unique_ptr<Work> ReduceScatter(void* data, int64_t chunk_count, DType dtype) = 0;
  // `data` holds world_size chunks; each rank's own chunk is gathered into every rank's copy.
  virtual std::unique_ptr<Work> AllGather(void* data, int64_t chunk_count, DType dtype) = 0;
  // Several reduce-scatters (all-gathers) of one dtype issued together, as the engine issues a
  // step's: each buffer ends as ReduceScatter (AllGather) would leave it, and one Work waits for
  // them all. A backend may run them as one collective (Gloo: one order check, and every buffer's
  // transfers in flight at once, where one collective each cost a round of messages and a thread
  // hand-off); by default they are issued one after the other.
  virtual std::unique_ptr<Work> ReduceScatterGroup(const std::vector<ChunkedBuffer>& buffers,
                                                   DType dtype);
  virtual std::unique_ptr<Work> AllGatherGroup(const std::vector<ChunkedBuffer>& buffers,
                                               DType dtype);
  virtual std::unique_ptr<Work> Broadcast(void* data, int64_t count, DType dtype, int64_t root) = 0;
  virtual std::unique_ptr<Work> Barrier() = 0;

  // Fails the collective in flight and every later one with `why` (for instance: the coordinator
  // declared a member lost). Tears the transport down, so the collective in flight ends at once
  // here and on the peers, and nothing a peer sends later (a stopped rank that resumes) lands in
  // this rank's memory.
  virtual void Abort(const absl::Status& why) = 0;

  // Bytes this rank sent and received, by collective ("all_reduce", "reduce_scatter",
  // "all_gather", "broadcast").
  virtual std::map<std::string, int64_t> BytesSent() const = 0;
  virtual std::map<std::string, int64_t> BytesReceived() const = 0;
};

}  // namespace zerod::comm

#endif  // ZEROD_RUNTIME_COMM_COMMUNICATOR_H_
