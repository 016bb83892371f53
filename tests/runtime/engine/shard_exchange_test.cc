// ShardExchange: ranks (threads here, each with its own mappings of real POSIX shared memory) pull
// each other's shards with no peer taking part, see every shard as of the same write phase, and
// an engine that has one gathers whichever units its rank wants, in any order.

#include "runtime/engine/shard_exchange.h"

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/comm/prefix_store.h"
#include "runtime/common/status_macros.h"
#include "runtime/engine/zero_engine.h"
#include "tests/util/test_time.h"

namespace zerod::engine {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBytes = 64;

// How long a wait that should succeed may take.
absl::Duration Timeout() { return zerod::testing::Scaled(absl::Seconds(30)); }

std::shared_ptr<comm::Store> NewStore() {
  static int group = 0;
  return std::make_shared<comm::PrefixStore>(absl::StrCat("exchange", group++),
                                             std::make_shared<comm::InMemoryStore>());
}

// Runs fn(rank) on `world` threads.
void OnRanks(int64_t world, const std::function<void(int64_t)>& fn) {
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) threads.emplace_back([&, r] { fn(r); });
  for (std::thread& t : threads) t.join();
}

std::unique_ptr<ShardExchange> Connect(comm::Store& store, int64_t rank, int64_t world,
                                       bool enabled = true) {
  auto exchange = ShardExchange::Connect(store, "shards", rank, world, kBytes, enabled, Timeout());
  EXPECT_TRUE(exchange.ok()) << exchange.status();
  return exchange.ok() ? *std::move(exchange) : nullptr;
}

// Rank r's shard in write phase `phase`: bytes r * 16 + phase, each.
void Write(ShardExchange& e, int64_t phase) {
  ASSERT_TRUE(e.BeginWrite(Timeout()).ok());
  std::memset(e.own(), static_cast<int>(e.rank() * 16 + phase), kBytes);
  e.EndWrite();
}

// Every rank's bytes [8, 24) pulled into one buffer.
std::vector<char> PullAll(ShardExchange& e, int64_t world) {
  std::vector<char> out(static_cast<size_t>(16 * world));
  std::vector<ShardExchange::Copy> copies;
  for (int64_t r = 0; r < world; ++r) copies.push_back({r, 8, 16, out.data() + 16 * r});
  EXPECT_TRUE(e.Pull(std::move(copies), Timeout())->Wait(Timeout()).ok());
  return out;
}

TEST(ShardExchange, EveryRankPullsEveryShardAsOfTheSamePhase) {
  auto store = NewStore();
  const int64_t world = 3;
  OnRanks(world, [&](int64_t rank) {
    std::unique_ptr<ShardExchange> e = Connect(*store, rank, world);
    ASSERT_NE(e, nullptr);
    for (int64_t phase = 1; phase <= 3; ++phase) {
      Write(*e, phase);
      const std::vector<char> got = PullAll(*e, world);
      for (int64_t r = 0; r < world; ++r) {
        for (int64_t i = 0; i < 16; ++i) {
          ASSERT_EQ(got[static_cast<size_t>(16 * r + i)], static_cast<char>(r * 16 + phase))
              << "rank " << rank << " reading rank " << r << " in phase " << phase;
        }
      }
    }
    EXPECT_EQ(e->bytes_pulled(), 3 * 16 * (world - 1));
  });
}

TEST(ShardExchange, APullWaitsUntilThePeerHasPublishedThePhase) {
  auto store = NewStore();
  std::atomic<bool> pull_waiting{false};
  OnRanks(2, [&](int64_t rank) {
    std::unique_ptr<ShardExchange> e = Connect(*store, rank, 2);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->BeginWrite(Timeout()).ok());
    if (rank == 0) {
      std::memset(e->own(), 1, kBytes);
      e->EndWrite();
      char got = 0;
      std::unique_ptr<comm::Work> pull = e->Pull({{1, 0, 1, &got}}, Timeout());
      // Rank 1 is inside its write phase: the pull cannot be done.
      EXPECT_EQ(pull->Wait(absl::Milliseconds(20)).code(), absl::StatusCode::kDeadlineExceeded);
      pull_waiting = true;
      ASSERT_TRUE(pull->Wait(Timeout()).ok());
      EXPECT_EQ(got, 7) << "rank 1's new values, not the ones before its phase";
    } else {
      while (!pull_waiting) std::this_thread::yield();
      std::memset(e->own(), 7, kBytes);
      e->EndWrite();
    }
  });
}

TEST(ShardExchange, IsEveryRanksOrNobodys) {
  auto store = NewStore();
  OnRanks(3, [&](int64_t rank) {
    auto e =
        ShardExchange::Connect(*store, "shards", rank, 3, kBytes, /*enabled=*/rank != 2, Timeout());
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(*e, nullptr) << "rank " << rank;
  });
}

TEST(ShardExchange, AWriteNamesTheRanksThatDoNotArrive) {
  auto store = NewStore();
  std::atomic<bool> done{false};
  OnRanks(3, [&](int64_t rank) {
    std::unique_ptr<ShardExchange> e = Connect(*store, rank, 3);
    ASSERT_NE(e, nullptr);
    if (rank == 0) {
      const absl::Status s = e->BeginWrite(absl::Milliseconds(50));
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
      EXPECT_THAT(std::string(s.message()), HasSubstr("not reached by ranks 1, 2"));
      done = true;
    } else {
      while (!done) std::this_thread::yield();  // keeps its mapping until rank 0 has looked
    }
  });
}

TEST(ShardExchange, AbortFailsAPullWaitingForAPeer) {
  auto store = NewStore();
  std::atomic<bool> done{false};
  OnRanks(2, [&](int64_t rank) {
    std::unique_ptr<ShardExchange> e = Connect(*store, rank, 2);
    ASSERT_NE(e, nullptr);
    if (rank == 0) {
      ASSERT_TRUE(e->BeginWrite(Timeout()).ok());
      e->EndWrite();  // phase 1: rank 1 never publishes it
      char got = 0;
      std::unique_ptr<comm::Work> pull = e->Pull({{1, 0, 1, &got}}, Timeout());
      e->Abort(absl::AbortedError("rank 1 was lost"));
      const absl::Status s = pull->Wait(Timeout());
      EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
      EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 was lost"));
      done = true;
    } else {
      // Arrives (so rank 0's phase begins) but never ends its phase.
      (void)e->BeginWrite(absl::Milliseconds(1));
      while (!done) std::this_thread::yield();
    }
  });
}

// Two ranks at stage 3 over six tensors in three units of two: each gathers the units it wants,
// with no collective, and after a step sees the new values.
TEST(ShardExchange, EnginesGatherDifferentUnitsWithoutACollective) {
  auto store = NewStore();
  plan::PlanInput in;
  for (int i = 0; i < 6; ++i) {
    in.tensors.push_back({absl::StrCat("t", i), {4}, DType::kFloat32, absl::StrCat("u", i / 2)});
  }
  in.options.world_size = 2;
  in.options.stage = 3;
  in.options.param_dtype = DType::kFloat32;
  in.options.grad_dtype = DType::kFloat32;
  in.options.reduce_bucket_bytes = 32;
  in.options.gather_unit_bytes = 32;
  in.options.partition_alignment_numel = 2;
  in.options.max_live_units = 2;
  auto made = plan::ShardPlan::Create(in);
  ASSERT_TRUE(made.ok()) << made.status();
  auto plan = std::make_shared<const plan::ShardPlan>(*std::move(made));
  int64_t shard_bytes = 0;
  for (const plan::Allocation& a : plan->Allocations()) {
    if (a.category == plan::MemoryCategory::kParams) shard_bytes = a.numel * a.element_bytes;
  }
  auto init = [](int64_t t, float* p) {
    for (int64_t i = 0; i < 4; ++i) p[i] = static_cast<float>(10 * t + i);
  };
  std::vector<absl::Status> status(2);
  OnRanks(2, [&](int64_t rank) {
    status[static_cast<size_t>(rank)] = [&]() -> absl::Status {
      ZEROD_ASSIGN_OR_RETURN(auto comm,
                             comm::GlooCommunicator::Create(
                                 std::make_shared<comm::PrefixStore>("gloo", store), rank, 2, {}));
      EngineOptions options;
      options.adam = {1e-1, 0.9, 0.99, 1e-8, 0.0, false};
      ZEROD_ASSIGN_OR_RETURN(
          options.shard_exchange,
          ShardExchange::Connect(*store, "shards", rank, 2, shard_bytes, true, Timeout()));
      if (options.shard_exchange == nullptr) return absl::InternalError("no exchange");
      ZEROD_ASSIGN_OR_RETURN(auto e, ZeroEngine::Create(plan, comm.get(), std::move(options)));
      EXPECT_TRUE(e->pulls_gathers());
      ZEROD_RETURN_IF_ERROR(e->InitParameters(init));
      auto expect_unit = [&](int64_t unit, float moved) -> absl::Status {
        for (int64_t t = 0; t < 6; ++t) {
          if (e->UnitOf(t) != unit) continue;
          std::vector<float> got(4);
          ZEROD_RETURN_IF_ERROR(e->ParamToFloat(t, got.data()));
          for (int64_t i = 0; i < 4; ++i) {
            EXPECT_NEAR(got[static_cast<size_t>(i)], 10 * t + i - moved, 1e-4)
                << "rank " << rank << " tensor " << t;
          }
        }
        return absl::OkStatus();
      };
      if (e->num_units() != 3) return absl::InternalError("expected three units");
      // Rank 0 wants units 2 then 0, rank 1 only unit 1: no rank waits for another.
      for (int64_t unit : rank == 0 ? std::vector<int64_t>{2, 0} : std::vector<int64_t>{1}) {
        ZEROD_RETURN_IF_ERROR(e->Gather(unit));
        ZEROD_RETURN_IF_ERROR(expect_unit(unit, 0));
        ZEROD_RETURN_IF_ERROR(e->Release(unit));
      }
      EXPECT_EQ(e->BytesSent().count("all_gather"), 0u);
      std::vector<float> grad(4, 1.0f);
      for (int64_t t = 5; t >= 0; --t) ZEROD_RETURN_IF_ERROR(e->AccumulateGrad(t, grad.data()));
      ZEROD_RETURN_IF_ERROR(e->Step().status());
      ZEROD_ASSIGN_OR_RETURN(const std::vector<float> master, e->FullMasterParameters());
      const float moved = 10 * 5 + 3 - master.back();
      EXPECT_GT(moved, 0.05f) << "the step moved the parameters";
      // Every element moved as much (the same gradient everywhere); gathers see the new values.
      for (int64_t unit : {1, 0, 2}) {
        ZEROD_RETURN_IF_ERROR(e->Gather(unit));
        ZEROD_RETURN_IF_ERROR(expect_unit(unit, moved));
        ZEROD_RETURN_IF_ERROR(e->Release(unit));
      }
      return absl::OkStatus();
    }();
  });
  for (const absl::Status& s : status) EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace zerod::engine
