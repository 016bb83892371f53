// The lead connections (runtime/comm/gloo/lead_mesh.h) between real ranks: threads of this
// process over loopback TCP, rendezvous through an InMemoryStore.

#include "runtime/comm/gloo/lead_mesh.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <latch>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/comm/in_memory_store.h"
#include "tests/util/test_time.h"

namespace zerod::comm::internal {
namespace {

using ::zerod::testing::Scaled;

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr size_t kMaxFrame = size_t{64} << 10;
// Every wait's bound, scaled for the build: a wait that must not run out.
const milliseconds kLong = absl::ToChronoMilliseconds(Scaled(absl::Seconds(30)));

std::vector<int> Others(int rank, int world) {
  std::vector<int> peers;
  for (int r = 0; r < world; ++r) {
    if (r != rank) peers.push_back(r);
  }
  return peers;
}

// Connects `world` ranks (rank r with a frame limit of limits[r], kMaxFrame if not given; every
// wait spinning `spin` first) and runs body(rank, mesh) on each at once.
void OnMesh(int world, const std::function<void(int, LeadMesh&)>& body,
            std::vector<size_t> limits = {},
            std::chrono::microseconds spin = std::chrono::microseconds(0)) {
  InMemoryStore store;
  limits.resize(world, kMaxFrame);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto mesh = LeadMesh::Connect(store, "m/", r, Others(r, world), "127.0.0.1", limits[r],
                                    Scaled(absl::Seconds(30)));
      ASSERT_TRUE(mesh.ok()) << mesh.status();
      (*mesh)->SetSpin(spin);
      body(r, **mesh);
    });
  }
  for (auto& t : threads) t.join();
}

std::vector<char> Frame(int from, int to, int index, size_t bytes) {
  std::vector<char> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = static_cast<char>(from * 31 + to * 7 + index + i);
  return v;
}

void Send(LeadMesh& mesh, int peer, const std::vector<char>& frame) {
  // Split into a header and a payload, as leads go.
  const size_t header = std::min<size_t>(frame.size(), 8);
  mesh.Send(peer, frame.data(), header, frame.data() + header, frame.size() - header);
}

// Waits that spin before they sleep (LeadMesh::SetSpin) and waits that sleep at once.
constexpr std::chrono::microseconds kSpins[] = {std::chrono::microseconds(0),
                                                std::chrono::microseconds(50)};
// A spin far longer than the waits below: it must end at their deadline or a Close all the same.
const std::chrono::microseconds kEndlessSpin =
    absl::ToChronoMicroseconds(Scaled(absl::Seconds(20)));

TEST(LeadMesh, FramesArriveInOrderWhileEveryRankWritesFirst) {
  // 4 MiB to each peer before anyone reads: far more than a socket takes, so sends queue and are
  // written while the rank waits for its own frames.
  const int frames = 64;
  for (const auto spin : kSpins) {
    SCOPED_TRACE(::testing::Message() << "spin " << spin.count() << " us");
    OnMesh(
        3,
        [&](int r, LeadMesh& mesh) {
          for (int i = 0; i < frames; ++i) {
            for (int peer : Others(r, 3))
              Send(mesh, peer, Frame(r, peer, i, i == 0 ? 0 : kMaxFrame - i));
          }
          std::vector<char> got;
          for (int i = 0; i < frames; ++i) {
            for (int peer : Others(r, 3)) {
              mesh.Receive(peer, got, kLong);
              ASSERT_EQ(got, Frame(peer, r, i, i == 0 ? 0 : kMaxFrame - i)) << "frame " << i;
            }
          }
          mesh.Flush(kLong);
        },
        {}, spin);
  }
}

// Frames longer than 16 KiB that are not all in when their length is read skip the inbox and are
// read into storage of their own (then that storage is reused, larger or smaller): every size
// around that cut, mixed with short ones, both ranks writing first, arrives whole and in order.
TEST(LeadMesh, FramesOfEverySizeAroundTheDirectReadArriveWholeAndInOrder) {
  const size_t cut = size_t{16} << 10;
  const std::vector<size_t> sizes = {
      0,         1, cut - 1,       cut,     cut + 1, 7,       cut + 9,       100,           40000,
      kMaxFrame, 3, kMaxFrame - 1, cut + 1, 0,       2 * cut, kMaxFrame / 2, kMaxFrame - 5, 64};
  const int rounds = 20;
  OnMesh(2, [&](int r, LeadMesh& mesh) {
    const int peer = 1 - r;
    for (int i = 0; i < rounds; ++i) {
      for (size_t k = 0; k < sizes.size(); ++k) {
        Send(mesh, peer, Frame(r, peer, i * 100 + static_cast<int>(k), sizes[k]));
      }
    }
    std::vector<char> got;
    for (int i = 0; i < rounds; ++i) {
      for (size_t k = 0; k < sizes.size(); ++k) {
        mesh.Receive(peer, got, kLong);
        ASSERT_EQ(got, Frame(peer, r, i * 100 + static_cast<int>(k), sizes[k]))
            << "round " << i << ", frame of " << sizes[k] << " bytes";
      }
    }
    mesh.Flush(kLong);
  });
}

TEST(LeadMesh, StrayConnectionsAreDroppedAndThePeersStillConnect) {
  InMemoryStore store;
  std::thread rank0([&] {
    auto mesh =
        LeadMesh::Connect(store, "m/", 0, {1}, "127.0.0.1", kMaxFrame, Scaled(absl::Seconds(30)));
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    std::vector<char> got;
    (*mesh)->Receive(1, got, kLong);
    EXPECT_EQ(got, Frame(1, 0, 0, 100));
  });
  absl::StatusOr<std::string> where = store.Get("m/0", Scaled(absl::Seconds(30)));
  ASSERT_TRUE(where.ok()) << where.status();
  std::vector<std::string> parts = absl::StrSplit(*where, ' ');
  ASSERT_EQ(parts.size(), 2u);
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(parts[1], &port));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::inet_pton(AF_INET, parts[0].c_str(), &addr.sin_addr), 1);
  // A stranger that writes garbage, one that says nothing, and one with the right shape but the
  // wrong nonce: none of them is taken for rank 1.
  std::vector<int> strays;
  for (int i = 0; i < 3; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    strays.push_back(fd);
  }
  const std::string garbage(32, 'x');
  ASSERT_EQ(::write(strays[0], garbage.data(), garbage.size()), 32);
  uint64_t forged[4] = {0x3168736d64614c7a, 12345, 1, 0};  // magic, a guessed nonce, from 1, to 0
  ASSERT_EQ(::write(strays[2], forged, sizeof(forged)), static_cast<ssize_t>(sizeof(forged)));
  std::thread rank1([&] {
    auto mesh =
        LeadMesh::Connect(store, "m/", 1, {0}, "127.0.0.1", kMaxFrame, Scaled(absl::Seconds(30)));
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    Send(**mesh, 0, Frame(1, 0, 0, 100));
    (*mesh)->Flush(kLong);
  });
  rank0.join();
  rank1.join();
  for (int fd : strays) ::close(fd);
}

TEST(LeadMesh, ConnectNamesTheRankThatNeverCame) {
  InMemoryStore store;
  auto mesh =
      LeadMesh::Connect(store, "m/", 0, {1, 2}, "127.0.0.1", kMaxFrame, absl::Milliseconds(200));
  ASSERT_FALSE(mesh.ok());
  EXPECT_THAT(mesh.status().message(), HasSubstr("for rank 1 (and 1 more) to connect"));
}

TEST(LeadMesh, AFrameOverTheLimitIsNamed) {
  // Rank 1 may send 64 KiB frames; rank 0 takes at most 1 KiB.
  OnMesh(2,
         [&](int r, LeadMesh& mesh) {
           if (r == 1) {
             Send(mesh, 0, Frame(1, 0, 0, 4096));
             mesh.Flush(kLong);
             return;
           }
           std::vector<char> got;
           try {
             mesh.Receive(1, got, kLong);
             ADD_FAILURE() << "an over-long frame was taken";
           } catch (const std::runtime_error& e) {
             EXPECT_THAT(e.what(), HasSubstr("rank 1 sent a lead of 4096 bytes (at most 1024)"));
           }
         },
         {1024, kMaxFrame});
}

TEST(LeadMesh, APeersFramesAreTakenAfterItClosesThenItsCloseIsNamed) {
  InMemoryStore store;
  std::thread rank1([&] {
    auto mesh =
        LeadMesh::Connect(store, "m/", 1, {0}, "127.0.0.1", kMaxFrame, Scaled(absl::Seconds(30)));
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    Send(**mesh, 0, Frame(1, 0, 0, 100));
    Send(**mesh, 0, Frame(1, 0, 1, 200));
    (*mesh)->Flush(kLong);
  });  // its mesh is destroyed: the connection closes
  auto mesh =
      LeadMesh::Connect(store, "m/", 0, {1}, "127.0.0.1", kMaxFrame, Scaled(absl::Seconds(30)));
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  rank1.join();
  std::vector<char> got;
  (*mesh)->Receive(1, got, kLong);
  EXPECT_EQ(got, Frame(1, 0, 0, 100));
  (*mesh)->Receive(1, got, kLong);
  EXPECT_EQ(got, Frame(1, 0, 1, 200));
  try {
    (*mesh)->Receive(1, got, kLong);
    ADD_FAILURE() << "a closed peer's lead was waited for";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1 closed its lead connection"));
  }
  EXPECT_THROW(Send(**mesh, 1, Frame(0, 1, 0, 10)), std::runtime_error);
}

// A frame sent 200 ms after its receiver starts to wait: a wait that spins longer than that takes
// it while spinning and never sleeps, one that does not spin sleeps for it; waits() tells which.
// Only the waiting rank's counts move (the sender never waits).
TEST(LeadMesh, AWaitCountsWhetherItsFrameCameWhileItSpunOrAfterItSlept) {
  for (const auto spin : {std::chrono::microseconds(0), kEndlessSpin}) {
    SCOPED_TRACE(::testing::Message() << "spin " << spin.count() << " us");
    std::latch waiting(1);
    OnMesh(
        2,
        [&](int r, LeadMesh& mesh) {
          if (r == 1) {
            waiting.wait();
            std::this_thread::sleep_for(milliseconds(200));
            Send(mesh, 0, Frame(1, 0, 0, 100));
            mesh.Flush(kLong);
            EXPECT_EQ(mesh.waits().spun + mesh.waits().slept, 0);
            return;
          }
          EXPECT_EQ(mesh.waits().spun + mesh.waits().slept, 0) << "no wait yet";
          std::vector<char> got;
          waiting.count_down();
          mesh.Receive(1, got, kLong);
          ASSERT_EQ(got, Frame(1, 0, 0, 100));
          const LeadMesh::Waits waits = mesh.waits();
          if (spin == kEndlessSpin) {
            EXPECT_GE(waits.spun, 1);
            EXPECT_EQ(waits.slept, 0) << "a wait that spins 20 s slept";
          } else {
            EXPECT_EQ(waits.spun, 0);
            EXPECT_GE(waits.slept, 1);
          }
        },
        {}, spin);
  }
}

TEST(LeadMesh, CloseWakesAWaitHereAndThePeersAtOnce) {
  for (const auto spin : {std::chrono::microseconds(0), kEndlessSpin}) {
    SCOPED_TRACE(::testing::Message() << "spin " << spin.count() << " us");
    OnMesh(
        2,
        [&](int r, LeadMesh& mesh) {
          std::vector<char> got;
          const auto start = std::chrono::steady_clock::now();
          if (r == 0) {
            std::thread closer([&] {
              std::this_thread::sleep_for(milliseconds(100));
              mesh.Close();
            });
            EXPECT_THROW(mesh.Receive(1, got, kLong), std::runtime_error);
            closer.join();
            EXPECT_THROW(Send(mesh, 1, Frame(0, 1, 0, 10)), std::runtime_error);
          } else {
            try {
              mesh.Receive(0, got, kLong);
              ADD_FAILURE() << "a closed peer's lead was taken";
            } catch (const std::runtime_error& e) {
              EXPECT_THAT(e.what(), HasSubstr("rank 0 closed its lead connection"));
            }
          }
          // Woken, not timed out (kLong is 30 s) nor spun out (20 s; all three scaled).
          EXPECT_LT(std::chrono::steady_clock::now() - start,
                    absl::ToChronoMilliseconds(Scaled(absl::Seconds(10))));
        },
        {}, spin);
  }
}

TEST(LeadMesh, AWaitForALeadThatNeverComesTimesOutNamingThePeer) {
  for (const auto spin : {std::chrono::microseconds(0), kEndlessSpin}) {
    SCOPED_TRACE(::testing::Message() << "spin " << spin.count() << " us");
    std::latch done(1);
    OnMesh(
        2,
        [&](int r, LeadMesh& mesh) {
          if (r == 1) {
            done.wait();  // sends nothing, and stays connected until rank 0 is done
            return;
          }
          std::vector<char> got;
          const auto start = std::chrono::steady_clock::now();
          try {
            mesh.Receive(1, got, milliseconds(50));
            ADD_FAILURE() << "no lead came, yet one was taken";
          } catch (const std::runtime_error& e) {
            EXPECT_THAT(e.what(), HasSubstr("no lead from rank 1 within 50 ms"));
          }
          // Not spun out (kEndlessSpin; both scaled).
          EXPECT_LT(std::chrono::steady_clock::now() - start,
                    absl::ToChronoMilliseconds(Scaled(absl::Seconds(10))));
          done.count_down();
        },
        {}, spin);
  }
}

}  // namespace
}  // namespace zerod::comm::internal
