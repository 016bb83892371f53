// The shared-memory transport of the Gloo communicator (shared_memory_mesh.h): its sums against a
// rank-order reference computed here, bit for bit; who uses it (every rank or none); that nothing
// is left in /dev/shm; and how a wait ends when a peer closes, stays silent, or exits.

#include "runtime/comm/gloo/shared_memory_mesh.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <latch>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/file_store.h"
#include "runtime/comm/gloo/element_sum.h"
#include "runtime/comm/in_memory_store.h"
#include "runtime/comm/prefix_store.h"
#include "runtime/common/half.h"
#include "runtime/common/mutex.h"
#include "tests/runtime/comm/gloo_ranks.h"

namespace zerod::comm {
namespace {

using ::zerod::testing::Scaled;

using internal::RingPart;
using internal::SharedMemoryMesh;
using ::testing::HasSubstr;

// A mesh operation's bound: `seconds`, scaled for the build.
std::chrono::milliseconds Within(int seconds) {
  return absl::ToChronoMilliseconds(Scaled(absl::Seconds(seconds)));
}

// Runs body(rank, mesh) for `world` meshes connected through one store, each on its thread.
void OnMeshes(int64_t world, const std::function<void(int64_t, SharedMemoryMesh&)>& body) {
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto mesh =
          SharedMemoryMesh::Connect(*store, "shm/", r, world, true, Scaled(absl::Seconds(30)));
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      ASSERT_NE(*mesh, nullptr) << "ranks of one process share memory";
      try {
        body(r, **mesh);
      } catch (const std::exception& e) {  // a failure, not the test binary's end
        ADD_FAILURE() << "rank " << r << ": " << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
}

// bf16 bits of a value that rank `rank` holds at element `i` of buffer `b`: not small integers,
// so the order of the additions shows in the rounded result.
uint16_t Term(int64_t rank, size_t b, int64_t i) {
  uint64_t x = static_cast<uint64_t>(rank * 1000003 + static_cast<int64_t>(b) * 7919 + i);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;  // splitmix64's finaliser
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return FloatToBf16(static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 6.0f - 3.0f);
}

// ((t0 + t1) + t2) + ..., rounded to bf16 after every addition, by the scalar kernel.
uint16_t RankOrderSum(int64_t world, size_t b, int64_t i) {
  uint16_t sum = Term(0, b, i);
  for (int64_t q = 1; q < world; ++q) {
    const uint16_t t = Term(q, b, i);
    internal::ElementSum(DType::kBFloat16, &sum, &sum, &t, 1, internal::SumIsa::kScalar);
  }
  return sum;
}

// Buffers whose chunks cut pieces anywhere: a piece holds a region of kSlotBytes / world for each
// rank, and the parts of a step sit end to end across it; more pieces than slots.
TEST(SharedMemoryMesh, AGroupSumsInRankOrderAndGathersBitForBit) {
  for (int64_t world : {2, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    const std::vector<int64_t> chunk_counts = {1, 70001, 0, 33, 150000, 5};
    OnMeshes(world, [&](int64_t r, SharedMemoryMesh& mesh) {
      std::vector<std::vector<uint16_t>> buffers;
      std::vector<RingPart> parts;
      for (size_t b = 0; b < chunk_counts.size(); ++b) {
        buffers.emplace_back(static_cast<size_t>(world * chunk_counts[b]));
        for (int64_t i = 0; i < world * chunk_counts[b]; ++i) buffers[b][i] = Term(r, b, i);
        if (chunk_counts[b] == 0) continue;
        parts.push_back({reinterpret_cast<char*>(buffers[b].data()),
                         internal::Chunks::Even(world, chunk_counts[b], 2)});
      }
      mesh.ReduceScatter(parts, DType::kBFloat16, /*then_all_gather=*/false, Within(30));
      for (size_t b = 0; b < chunk_counts.size(); ++b) {
        const int64_t chunk = chunk_counts[b];
        for (int64_t i = r * chunk; i < (r + 1) * chunk; ++i) {
          ASSERT_EQ(buffers[b][i], RankOrderSum(world, b, i)) << "buffer " << b << " element " << i;
        }
      }
      // Every rank's reduced chunk to every rank: afterwards each holds the whole sum.
      mesh.AllGather(parts, Within(30));
      for (size_t b = 0; b < chunk_counts.size(); ++b) {
        for (int64_t i = 0; i < world * chunk_counts[b]; ++i) {
          ASSERT_EQ(buffers[b][i], RankOrderSum(world, b, i)) << "buffer " << b << " element " << i;
        }
      }
    });
  }
}

// An all-reduce whose chunks are uneven (Chunks::Split), the last one empty at 4 ranks.
TEST(SharedMemoryMesh, AnAllReduceOfUnevenChunksGivesEveryRankTheRankOrderSum) {
  for (int64_t count : {int64_t{3}, int64_t{1000003}}) {
    SCOPED_TRACE(::testing::Message() << count << " elements");
    OnMeshes(4, [&](int64_t r, SharedMemoryMesh& mesh) {
      std::vector<uint16_t> data(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) data[i] = Term(r, 0, i);
      mesh.ReduceScatter(
          {{reinterpret_cast<char*>(data.data()), internal::Chunks::Split(4, count, 2)}},
          DType::kBFloat16, /*then_all_gather=*/true, Within(30));
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(data[i], RankOrderSum(4, 0, i)) << i;
    });
  }
}

// Every mode back to back, each a few pieces long, so that a rank that finishes one collective
// starts the next while others still read the last pieces of it: all-reduces, reduce-scatters,
// all-gathers and broadcasts from every root, each checked against its reference.
TEST(SharedMemoryMesh, CollectivesOfEveryKindBackToBackStayInStep) {
  for (int64_t world : {2, 3, 4}) {
    SCOPED_TRACE(::testing::Message() << "world " << world);
    const int64_t chunk = 3 * static_cast<int64_t>(SharedMemoryMesh::kSlotBytes) / 2 / world + 7;
    OnMeshes(world, [&](int64_t r, SharedMemoryMesh& mesh) {
      for (int round = 0; round < 6; ++round) {
        const int64_t n = world * chunk - round;  // uneven all-reduce chunks
        std::vector<uint16_t> data(static_cast<size_t>(world * chunk));
        for (int64_t i = 0; i < n; ++i) data[i] = Term(r, static_cast<size_t>(round), i);
        mesh.ReduceScatter(
            {{reinterpret_cast<char*>(data.data()), internal::Chunks::Split(world, n, 2)}},
            DType::kBFloat16, true, Within(30));
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(data[i], RankOrderSum(world, static_cast<size_t>(round), i)) << i;
        }
        const int64_t root = round % world;
        for (int64_t i = 0; i < n; ++i) data[i] = Term(r, 99, i);
        mesh.Broadcast(reinterpret_cast<char*>(data.data()), static_cast<size_t>(n) * 2, root,
                       Within(30));
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(data[i], Term(root, 99, i)) << i;
        const std::vector<RingPart> parts = {
            {reinterpret_cast<char*>(data.data()), internal::Chunks::Even(world, chunk, 2)}};
        for (int64_t i = 0; i < world * chunk; ++i) data[i] = Term(r, 7, i);
        mesh.ReduceScatter(parts, DType::kBFloat16, false, Within(30));
        for (int64_t i = r * chunk; i < (r + 1) * chunk; ++i) {
          ASSERT_EQ(data[i], RankOrderSum(world, 7, i)) << i;
        }
        mesh.AllGather(parts, Within(30));
        for (int64_t i = 0; i < world * chunk; ++i) {
          ASSERT_EQ(data[i], RankOrderSum(world, 7, i)) << i;
        }
      }
    });
  }
}

std::vector<char> Floats(int64_t n) { return std::vector<char>(static_cast<size_t>(n) * 4, 0); }

// Two meshes: rank 0 runs `body`; rank 1 stays silent, its mesh open, until rank 0 is done.
void WithASilentPeer(const std::function<void(SharedMemoryMesh&)>& body) {
  Notification over;
  OnMeshes(2, [&](int64_t r, SharedMemoryMesh& mesh) {
    if (r == 1) {
      over.WaitForNotification();
      return;
    }
    const absl::Cleanup release = [&] { over.Notify(); };
    body(mesh);
  });
}

// A wait on a peer that closes its segment (a rank that failed a collective or was aborted) fails
// at once, naming it, though the timeout is long.
TEST(SharedMemoryMesh, AWaitOnAPeerThatClosedFailsNamingIt) {
  // Every mesh stays open until each rank has its error: one destroyed closes too.
  std::latch failed(3);
  OnMeshes(3, [&](int64_t r, SharedMemoryMesh& mesh) {
    const absl::Cleanup arrive = [&] { failed.arrive_and_wait(); };
    if (r == 2) {
      absl::SleepFor(absl::Milliseconds(200));
      mesh.Close();
      return;
    }
    std::vector<char> data = Floats(3 * 1000);
    const auto start = std::chrono::steady_clock::now();
    try {
      mesh.ReduceScatter({{data.data(), internal::Chunks::Even(3, 1000, 4)}}, DType::kFloat32, true,
                         Within(60));
      ADD_FAILURE() << "rank " << r << " completed without rank 2";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 2 closed its shared memory"));
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, Within(20));
  });
}

// Closing a rank's own mesh (its communicator aborted) fails the wait on its thread too.
TEST(SharedMemoryMesh, ClosingThisRanksMeshFailsItsOwnWait) {
  WithASilentPeer([](SharedMemoryMesh& mesh) {
    std::thread closer([&] {
      absl::SleepFor(absl::Milliseconds(200));
      mesh.Close();
    });
    std::vector<char> data = Floats(2 * 10);
    EXPECT_THROW(
        {
          try {
            mesh.AllGather({{data.data(), internal::Chunks::Even(2, 10, 4)}}, Within(60));
          } catch (const std::runtime_error& e) {
            EXPECT_THAT(e.what(), HasSubstr("closed on this rank"));
            throw;
          }
        },
        std::runtime_error);
    closer.join();
  });
}

TEST(SharedMemoryMesh, AWaitOnASilentPeerTimesOutNamingIt) {
  WithASilentPeer([](SharedMemoryMesh& mesh) {
    std::vector<char> data = Floats(2 * 10);
    try {
      mesh.ReduceScatter({{data.data(), internal::Chunks::Even(2, 10, 4)}}, DType::kFloat32, false,
                         std::chrono::milliseconds(300));
      ADD_FAILURE() << "completed without rank 1";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 1 did not reach piece 1 of 1 of this collective"));
    }
  });
}

// A peer process killed mid-job cannot close its segment: its exit (a pidfd) ends the wait long
// before the timeout.
TEST(SharedMemoryMesh, APeerProcessThatExitsFailsTheWaitAtOnce) {
  std::string made = (std::filesystem::temp_directory_path() / "shm_exit_XXXXXX").string();
  ASSERT_NE(::mkdtemp(made.data()), nullptr);
  const std::filesystem::path dir = made;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    FileStore store(dir.string());
    auto mesh = SharedMemoryMesh::Connect(store, "shm/", 1, 2, true, Scaled(absl::Seconds(30)));
    ::_exit(mesh.ok() && *mesh != nullptr ? 0 : 3);  // without closing its segment
  }
  FileStore store(dir.string());
  auto mesh = SharedMemoryMesh::Connect(store, "shm/", 0, 2, true, Scaled(absl::Seconds(30)));
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  ASSERT_NE(*mesh, nullptr);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::vector<char> data = Floats(2 * 10);
  const auto start = std::chrono::steady_clock::now();
  try {
    (*mesh)->ReduceScatter({{data.data(), internal::Chunks::Even(2, 10, 4)}}, DType::kFloat32, true,
                           Within(60));
    ADD_FAILURE() << "completed without rank 1";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(),
                HasSubstr(absl::StrCat("rank 1 (pid ", child, ") exited during this collective")));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, Within(20));
  std::filesystem::remove_all(dir);
}

// The shared-memory segments' names in /dev/shm now.
std::set<std::string> SegmentsInDevShm() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    // This process's: "zerod-<pid>-" and 32 hex digits (other tests' processes, and checkpoint
    // snapshots' directories, have other names).
    const std::string mine = absl::StrCat("zerod-", ::getpid(), "-");
    const std::string name = entry.path().filename().string();
    if (name.size() == mine.size() + 32 && name.starts_with(mine) &&
        name.find_first_not_of("0123456789abcdef", mine.size()) == std::string::npos) {
      names.insert(name);
    }
  }
  return names;
}

// Once connected, no segment has a name left: a process that dies later leaves nothing behind.
TEST(GlooSharedMemory, EveryRankSharesMemoryAndNoNameOutlivesTheRendezvous) {
  // Every rank has connected before any runs its body (OnRanks).
  OnRanks(3, [&](int64_t, Communicator& c) {
    EXPECT_TRUE(static_cast<GlooCommunicator&>(c).UsesSharedMemory());
    const std::set<std::string> left = SegmentsInDevShm();
    EXPECT_TRUE(left.empty()) << *left.begin();
  });
}

// One rank created without shared memory turns it off for all of them: the large all-reduce then
// goes over TCP and still sums.
TEST(GlooSharedMemory, ARankCreatedWithoutItTurnsItOffForEveryRank) {
  auto store = std::make_shared<PrefixStore>("off", std::make_shared<InMemoryStore>());
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      GlooOptions options;
      options.timeout = Scaled(absl::Seconds(30));
      options.shared_memory = r != 1;
      auto comm = GlooCommunicator::Create(store, r, 3, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      EXPECT_FALSE((*comm)->UsesSharedMemory());
      const int64_t n = 1 << 20;
      std::vector<float> data(static_cast<size_t>(n), static_cast<float>(r + 1));
      ASSERT_TRUE((*comm)
                      ->AllReduce(data.data(), n, DType::kFloat32)
                      ->Wait(Scaled(absl::Seconds(30)))
                      .ok());
      for (float x : data) ASSERT_EQ(x, 6.0f);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(GlooSharedMemory, RanksGivenDifferentMinimumsAreNamedNotAborted) {
  const auto status = AllReduceWithOptionsPerRank(2, 1024, [](int64_t r, GlooOptions& o) {
    if (r == 0) o.shared_memory_min_bytes = 1024;
  });
  for (const absl::Status& s : status) {
    EXPECT_THAT(std::string(s.message()), HasSubstr("shared_memory_min_bytes")) << s;
  }
}

TEST(GlooSharedMemory, ANegativeMinimumIsInvalid) {
  GlooOptions options;
  options.shared_memory_min_bytes = -1;
  auto comm = GlooCommunicator::Create(std::make_shared<InMemoryStore>(), 0, 1, options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("shared_memory_min_bytes"));
}

}  // namespace
}  // namespace zerod::comm
