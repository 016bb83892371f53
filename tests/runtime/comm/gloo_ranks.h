#ifndef ZEROD_TESTS_RUNTIME_COMM_GLOO_RANKS_H_
#define ZEROD_TESTS_RUNTIME_COMM_GLOO_RANKS_H_

// Real Gloo ranks for tests: threads of the test process, each with its own communicator,
// connected over loopback TCP after a rendezvous through an InMemoryStore. The communicators'
// timeouts are scaled for the build (tests/util/test_time.h); a test that relates a wait to them
// scales the wait alike.

#include <functional>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/comm/prefix_store.h"
#include "tests/util/test_time.h"

namespace zerod::comm {

// Runs body(rank, communicator) on `world` ranks at once, their timeout Scaled(`timeout`). The body
// of rank `release` (if any) takes ownership of its communicator.
inline void OnRanks(int64_t world, const std::function<void(int64_t, Communicator&)>& body,
                    absl::Duration timeout = absl::Seconds(30), int64_t release = -1,
                    GlooOptions options = {}) {
  static int group = 0;
  auto store = std::make_shared<PrefixStore>("group" + std::to_string(group++),
                                             std::make_shared<InMemoryStore>());
  options.timeout = ::zerod::testing::Scaled(timeout);
  std::vector<std::thread> threads;
  // Every rank connected before any runs its body: a rank that fails its first collective at once
  // (a mismatch test) closes its connections, and a peer still connecting would fail to.
  std::latch connected(world);
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto comm = GlooCommunicator::Create(store, r, world, options);
      connected.arrive_and_wait();
      ASSERT_TRUE(comm.ok()) << comm.status();
      if (r == release) {
        body(r, *comm->release());
      } else {
        body(r, **comm);
      }
    });
  }
  for (auto& t : threads) t.join();
}

// Creates `world` ranks, each with the options `configure` sets for it (timeout 20 s, scaled), and
// runs body(rank, communicator) on each once every rank is created (none is destroyed while a peer
// still connects). Threads inherit their creator's CPU mask.
inline void OnRanksConfigured(int64_t world,
                              const std::function<void(int64_t, GlooOptions&)>& configure,
                              const std::function<void(int64_t, GlooCommunicator&)>& body) {
  static int group = 0;
  auto store = std::make_shared<PrefixStore>("options" + std::to_string(group++),
                                             std::make_shared<InMemoryStore>());
  std::latch created(world);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions options;
      options.timeout = ::zerod::testing::Scaled(absl::Seconds(20));
      configure(r, options);
      auto comm = GlooCommunicator::Create(store, r, world, options);
      created.arrive_and_wait();
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
}

// Each of `world` ranks, created with the options `configure` sets for it, runs an all-reduce of
// `count` floats; returns each rank's outcome (for ranks given options that differ).
inline std::vector<absl::Status> AllReduceWithOptionsPerRank(
    int64_t world, int64_t count, const std::function<void(int64_t, GlooOptions&)>& configure) {
  std::vector<absl::Status> status(static_cast<size_t>(world));
  OnRanksConfigured(world, configure, [&](int64_t r, GlooCommunicator& comm) {
    std::vector<float> data(static_cast<size_t>(count), 1.0f);
    status[static_cast<size_t>(r)] = comm.AllReduce(data.data(), count, DType::kFloat32)
                                         ->Wait(::zerod::testing::Scaled(absl::Seconds(20)));
  });
  return status;
}

}  // namespace zerod::comm

#endif  // ZEROD_TESTS_RUNTIME_COMM_GLOO_RANKS_H_
