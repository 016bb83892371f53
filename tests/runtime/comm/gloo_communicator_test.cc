// Gloo collectives among real ranks (threads of this process, connected over loopback TCP,
// rendezvous through an InMemoryStore), checked against sums computed here.

#include "runtime/comm/gloo/gloo_communicator.h"

#include <signal.h>

#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/common/half.h"
#include "runtime/common/mutex.h"
#include "tests/runtime/comm/gloo_ranks.h"
#include "tests/runtime/common/pinned_to_one_cpu.h"

namespace zerod::comm {
namespace {

using ::zerod::testing::Scaled;

using ::testing::HasSubstr;

float Value(int64_t rank, int64_t i) { return static_cast<float>((rank + 1) * 0.5 + i * 0.25); }

TEST(GlooCommunicator, AllReduceSumsInEveryDtype) {
  for (int64_t world : {1, 2, 3, 4}) {
    OnRanks(world, [&](int64_t r, Communicator& c) {
      const int64_t n = 1001;
      std::vector<float> f(n);
      std::vector<uint16_t> b(n), h(n);
      for (int64_t i = 0; i < n; ++i) {
        f[i] = Value(r, i);
        b[i] = FloatToBf16(Value(r, i % 8));
        h[i] = FloatToFp16(Value(r, i % 8));
      }
      ASSERT_TRUE(c.AllReduce(f.data(), n, DType::kFloat32)->Wait(Scaled(absl::Seconds(30))).ok());
      ASSERT_TRUE(c.AllReduce(b.data(), n, DType::kBFloat16)->Wait(Scaled(absl::Seconds(30))).ok());
      ASSERT_TRUE(c.AllReduce(h.data(), n, DType::kFloat16)->Wait(Scaled(absl::Seconds(30))).ok());
      for (int64_t i = 0; i < n; ++i) {
        double want = 0, want_small = 0;
        for (int64_t q = 0; q < world; ++q) {
          want += Value(q, i);
          want_small += Value(q, i % 8);
        }
        ASSERT_NEAR(f[i], want, 1e-4 * want) << "world " << world << " i " << i;
        ASSERT_NEAR(Bf16ToFloat(b[i]), want_small, 2e-2 * want_small);
        ASSERT_NEAR(Fp16ToFloat(h[i]), want_small, 2e-3 * want_small);
      }
    });
  }
}

TEST(GlooCommunicator, ReduceScatterAndAllGatherRings) {
  for (int64_t world : {1, 2, 3, 4}) {
    OnRanks(world, [&](int64_t r, Communicator& c) {
      const int64_t chunk = 37;  // odd on purpose
      std::vector<float> data(static_cast<size_t>(world * chunk));
      for (int64_t i = 0; i < world * chunk; ++i) data[i] = Value(r, i);
      ASSERT_TRUE(c.ReduceScatter(data.data(), chunk, DType::kFloat32)
                      ->Wait(Scaled(absl::Seconds(30)))
                      .ok());
      for (int64_t i = r * chunk; i < (r + 1) * chunk; ++i) {
        double want = 0;
        for (int64_t q = 0; q < world; ++q) want += Value(q, i);
        ASSERT_NEAR(data[i], want, 1e-4 * want) << "world " << world << " rank " << r;
      }
      // All-gather each rank's chunk (marked with its rank) into everyone's buffer.
      std::vector<uint16_t> gathered(static_cast<size_t>(world * chunk), 0);
      for (int64_t i = 0; i < chunk; ++i) gathered[r * chunk + i] = FloatToBf16(Value(r, i));
      ASSERT_TRUE(c.AllGather(gathered.data(), chunk, DType::kBFloat16)
                      ->Wait(Scaled(absl::Seconds(30)))
                      .ok());
      for (int64_t q = 0; q < world; ++q) {
        for (int64_t i = 0; i < chunk; ++i) {
          ASSERT_EQ(gathered[q * chunk + i], FloatToBf16(Value(q, i)));
        }
      }
      // Bytes: exactly the ring's (world - 1) chunks each way.
      EXPECT_EQ(c.BytesSent()["reduce_scatter"], (world - 1) * chunk * 4);
      EXPECT_EQ(c.BytesSent()["all_gather"], (world - 1) * chunk * 2);
      EXPECT_EQ(c.BytesReceived()["all_gather"], (world - 1) * chunk * 2);
    });
  }
}

TEST(GlooCommunicator, BroadcastAndBarrier) {
  OnRanks(3, [&](int64_t r, Communicator& c) {
    std::vector<float> data(10, static_cast<float>(r));
    ASSERT_TRUE(
        c.Broadcast(data.data(), 10, DType::kFloat32, 2)->Wait(Scaled(absl::Seconds(30))).ok());
    for (float x : data) ASSERT_EQ(x, 2.0f);
    ASSERT_TRUE(c.Barrier()->Wait(Scaled(absl::Seconds(30))).ok());
  });
}

TEST(GlooCommunicator, AbortReleasesAWaiterWithTheReason) {
  Notification done;
  OnRanks(2, [&](int64_t r, Communicator& c) {
    if (r == 1) {  // alive but never joins the collective (a hung rank)
      done.WaitForNotification();
      return;
    }
    std::vector<float> data(100, 1.0f);
    auto work = c.AllReduce(data.data(), 100, DType::kFloat32);
    EXPECT_EQ(work->Wait(absl::Milliseconds(100)).code(), absl::StatusCode::kDeadlineExceeded);
    c.Abort(absl::UnavailableError("job j: rank 1 was lost (no heartbeat for 10s)"));
    const absl::Status s = work->Wait(Scaled(absl::Seconds(5)));
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 was lost"));
    // Later collectives fail at once with the same reason.
    EXPECT_THAT(std::string(c.Barrier()->Wait(Scaled(absl::Seconds(1))).message()),
                HasSubstr("rank 1 was lost"));
    done.Notify();
  });
}

// A rank stopped mid-collective (SIGSTOP) and declared lost: the survivor's abort must end the
// collective in flight, not only its waiters, or the collective thread (and the destructor that
// joins it) stays in Gloo until its timeout.
TEST(GlooCommunicator, AnAbortedCommunicatorIsDestroyedAtOnceThoughItsPeerIsSilent) {
  Notification destroyed;
  OnRanks(
      2,
      [&](int64_t r, Communicator& c) {
        if (r == 1) {  // alive, holding its connections open, never joining the collective
          destroyed.WaitForNotification();
          return;
        }
        auto own = std::unique_ptr<Communicator>(&c);  // destroyed here, timed
        std::vector<float> data(100, 1.0f);
        auto work = c.AllReduce(data.data(), 100, DType::kFloat32);
        EXPECT_EQ(work->Wait(absl::Milliseconds(100)).code(), absl::StatusCode::kDeadlineExceeded);
        const absl::Time start = absl::Now();
        c.Abort(absl::AbortedError("job j: rank 1 was lost (no heartbeat for 2s)"));
        EXPECT_THAT(std::string(work->Wait(Scaled(absl::Seconds(50))).message()),
                    HasSubstr("rank 1 was lost"));
        own.reset();
        // The Gloo timeout is 60 s; a closed transport ends it at once (20 s: a loaded machine;
        // both scaled).
        EXPECT_LT(absl::Now() - start, Scaled(absl::Seconds(20)));
        destroyed.Notify();
      },
      absl::Seconds(60), /*release=*/0);
}

// A stopped rank that resumes after the others gave up on it sends what its collective would
// have: none of it may land in the survivor's buffer, which its owner may have freed by then.
TEST(GlooCommunicator, APeerThatResumesAfterAnAbortWritesNothingIntoTheAbortedBuffer) {
  Notification aborted;
  OnRanks(2, [&](int64_t r, Communicator& c) {
    std::vector<float> data(100, static_cast<float>(r + 1));
    if (r == 1) {
      aborted.WaitForNotification();  // "resumes" after rank 0 gave up
      const absl::Status s =
          c.AllGather(data.data(), 50, DType::kFloat32)->Wait(Scaled(absl::Seconds(20)));
      EXPECT_FALSE(s.ok()) << "the aborted peer must not take part";
      return;
    }
    auto work = c.AllGather(data.data(), 50, DType::kFloat32);
    EXPECT_EQ(work->Wait(absl::Milliseconds(100)).code(), absl::StatusCode::kDeadlineExceeded);
    c.Abort(absl::AbortedError("job j: rank 1 was lost"));
    EXPECT_FALSE(work->Wait(Scaled(absl::Seconds(20))).ok());
    aborted.Notify();
    // Rank 1's late collective has had every chance to arrive by the time its thread ends.
    absl::SleepFor(Scaled(absl::Milliseconds(500)));
    for (float x : data) ASSERT_EQ(x, 1.0f) << "a late transfer landed in an aborted buffer";
  });
}

// Giving up on one collective aborts its communicator: the peers cannot skip it, and its buffer
// must be let go of before the Work says it is done with it.
TEST(GlooCommunicator, AbortingOneWorkAbortsTheCommunicator) {
  Notification done;
  OnRanks(2, [&](int64_t r, Communicator& c) {
    if (r == 1) {
      done.WaitForNotification();
      return;
    }
    std::vector<float> data(10, 1.0f);
    auto first = c.AllReduce(data.data(), 10, DType::kFloat32);
    auto second = c.Barrier();
    first->Abort(absl::DeadlineExceededError("all_reduce gave up"));
    EXPECT_THAT(std::string(first->Wait(Scaled(absl::Seconds(20))).message()),
                HasSubstr("gave up"));
    EXPECT_THAT(std::string(second->Wait(Scaled(absl::Seconds(1))).message()),
                HasSubstr("gave up"));
    EXPECT_THAT(std::string(c.Barrier()->Wait(Scaled(absl::Seconds(1))).message()),
                HasSubstr("gave up"));
    done.Notify();
  });
}

// Each duration option out of its range is refused, naming the option.
TEST(GlooCommunicator, ADurationOptionOutOfRangeIsNamed) {
  struct Case {
    const char* name;
    absl::Duration value;
  };
  for (const Case& c :
       {Case{"unclaimed_grace", absl::Milliseconds(-1)}, Case{"unclaimed_grace", absl::Hours(25)},
        Case{"caller_spin", absl::Microseconds(-1)}, Case{"caller_spin", absl::Seconds(2)}}) {
    SCOPED_TRACE(c.name);
    GlooOptions options;
    if (std::string(c.name) == "caller_spin") {
      options.caller_spin = c.value;
    } else {
      options.unclaimed_grace = c.value;
    }
    auto comm = GlooCommunicator::Create(std::make_shared<InMemoryStore>(), 0, 1, options);
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(comm.status().message()), HasSubstr(c.name));
  }
}

// A caller waiting for a collective that travels on the leads alone spins before it sleeps; one
// whose data goes through Gloo never does (its Gloo threads would wait for a core). With a spin of
// a second, the waits of 20 inline all-reduces spin and none sleeps; the waits of an all-gather
// too large to go inline, if any, sleep at once.
TEST(GlooCommunicator, ACallerSpinsOnlyOnCollectivesThatTravelOnTheLeads) {
  GlooOptions options;
  // Real time: the peer's lead must come within the spin, which is at its maximum (1 s) already.
  options.caller_spin = absl::Seconds(1);
  // The callers run every collective: none is left to the collective thread (which never spins)
  // by a caller descheduled between issuing and waiting.
  options.unclaimed_grace = absl::Hours(1);
  OnRanks(
      2,
      [&](int64_t, Communicator& c) {
        auto& gloo = dynamic_cast<GlooCommunicator&>(c);
        std::vector<float> data(1024, 1.0f);
        for (int i = 0; i < 20; ++i) {
          ASSERT_TRUE(c.AllReduce(data.data(), 1024, DType::kFloat32)
                          ->Wait(Scaled(absl::Seconds(30)))
                          .ok());
        }
        const internal::LeadMesh::Waits inline_waits = gloo.LeadWaits();
        EXPECT_GE(inline_waits.spun, 1);
        EXPECT_EQ(inline_waits.slept, 0) << "a wait that spins for a second slept";
        // One float a peer more than goes inline.
        const int64_t chunk = static_cast<int64_t>(internal::LeadExchange::MaxInlineBytes(
                                                       internal::CollectiveKind::kAllGather, 2) /
                                                   4) +
                              1;
        std::vector<float> big(static_cast<size_t>(2 * chunk));
        ASSERT_TRUE(
            c.AllGather(big.data(), chunk, DType::kFloat32)->Wait(Scaled(absl::Seconds(30))).ok());
        EXPECT_EQ(gloo.LeadWaits().spun, inline_waits.spun) << "the all-gather's lead wait spun";
      },
      absl::Seconds(30), -1, options);
}

// By default a caller spins before it sleeps, yielding its CPU between polls, however many CPUs
// the ranks share: 2 ranks on one CPU (threads inherit their creator's mask) spin too, and since
// every wait spins first, none sleeps without having spun. Yielding is what lets the peer run
// there; only collective_bench shows its effect (the time), no test.
TEST(GlooCommunicator, ByDefaultACallerSpinsThoughRanksShareACpu) {
  PinnedToOneCpu pinned;
  GlooOptions options;
  options.unclaimed_grace = absl::Hours(1);  // the callers run every collective (see above)
  OnRanks(
      2,
      [&](int64_t, Communicator& c) {
        std::vector<float> data(1024, 1.0f);
        for (int i = 0; i < 20; ++i) {
          ASSERT_TRUE(c.AllReduce(data.data(), 1024, DType::kFloat32)
                          ->Wait(Scaled(absl::Seconds(30)))
                          .ok());
        }
        // A lead already in costs no wait, so a run whose leads all were in passes with no spin
        // too; one that waited at all and never spun fails.
        const internal::LeadMesh::Waits waits = dynamic_cast<GlooCommunicator&>(c).LeadWaits();
        EXPECT_LE(waits.slept, waits.spun) << "a wait slept without spinning first";
      },
      absl::Seconds(30), -1, options);
}

// Gloo writes with writev: without this a write to a peer that closed its end kills the process.
TEST(GlooCommunicator, CreatingOneIgnoresSigpipeUnlessTheProgramHandlesIt) {
  OnRanks(1, [&](int64_t, Communicator&) {});
  struct sigaction current {};
  ASSERT_EQ(sigaction(SIGPIPE, nullptr, &current), 0);
  EXPECT_EQ(current.sa_handler, SIG_IGN);
}

TEST(GlooCommunicator, MismatchedCollectivesFailWithBothSidesNamed) {
  OnRanks(2, [&](int64_t r, Communicator& c) {
    std::vector<float> data(64, 1.0f);
    // Rank 0 all-gathers 20 per rank, rank 1 reduce-scatters 16: a broken SPMD order.
    const absl::Status s =
        r == 0 ? c.AllGather(data.data(), 20, DType::kFloat32)->Wait(Scaled(absl::Seconds(20)))
               : c.ReduceScatter(data.data(), 16, DType::kFloat32)->Wait(Scaled(absl::Seconds(20)));
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr("collective mismatch"));
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(r == 0 ? "rank 1 called #1 reduce_scatter(fp32 x 16)"
                                 : "rank 0 called #1 all_gather(fp32 x 20)"));
  });
}

TEST(GlooCommunicator, APeerThatDiesFailsTheCollectiveAtOnce) {
  OnRanks(2, [&](int64_t r, Communicator& c) {
    // Both connected first: a rank 1 gone while rank 0 still connects fails rank 0's Create.
    ASSERT_TRUE(c.Barrier()->Wait(Scaled(absl::Seconds(20))).ok());
    if (r == 1) return;  // its communicator closes its connections
    std::vector<float> data(100, 1.0f);
    const absl::Status s =
        c.AllReduce(data.data(), 100, DType::kFloat32)->Wait(Scaled(absl::Seconds(20)));
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(s.message()), HasSubstr("all_reduce on rank 0 failed"));
  });
}

}  // namespace
}  // namespace zerod::comm
