// collective_bench: the Gloo Communicator's all-reduce, reduce-scatter, all-gather and broadcast
// among 2, 3 and 4 ranks, each rank its own process (rendezvous through a FileStore in a
// temporary directory), 4 KiB to 64 MiB, beside the machine's loopback TCP round trip and
// bandwidth measured in the same run. Prints one JSON object per line (bench/collective_report.py
// turns them, with torch's from collective_bench_torch.py, into a table; bench/collective_bench.sh
// runs all three).
//
//   build/bin/collective_bench [--worlds 2,3,4] [--sizes 4KiB,64KiB,1MiB,64MiB] [--min-time 0.3]
//                              [--ops all_reduce,broadcast]
//
// A size is the bytes of the buffer every rank passes: the whole buffer of an all-reduce or a
// broadcast, all world chunks of a reduce-scatter or an all-gather (--dtype elements, fp32 by
// default). Each size runs warm-up iterations, then as many as fill --min-time (at least 5); an
// iteration takes what its slowest rank took, and the median iteration counts. "lead_share" is what
// a header-only lead exchange (a barrier: what a collective too large to go inline pays for the
// order check) takes, as a share of the collective's time; collectives that go inline carry their
// check in the data message itself and pay no extra message. "lead_waits_spun" and
// "lead_waits_slept" count rank 0's rounds of waiting on its lead connections over the whole timed
// run (its two bookkeeping collectives included) that spun first (GlooOptions::caller_spin; none
// for collectives whose data goes through Gloo) and that slept, in vain after spinning or at once
// (GlooCommunicator::LeadWaits; a long frame that comes in parts may take several rounds): spun
// and none slept is a small collective that never paid a wake-up.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "runtime/comm/file_store.h"
#include "runtime/comm/gloo/gloo_communicator.h"
#include "runtime/comm/gloo/lead_exchange.h"
#include "runtime/common/units.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace zerod;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Per-iteration times in microseconds, `ranks` runs of equal length end to end: an iteration takes
// what its slowest rank took, and the median iteration counts (in microseconds).
double MedianOfSlowest(const std::vector<float>& times, size_t ranks) {
  const size_t n = times.size() / ranks;
  std::vector<double> slowest(n, 0.0);
  for (size_t r = 0; r < ranks; ++r) {
    for (size_t i = 0; i < n; ++i) slowest[i] = std::max(slowest[i], double{times[r * n + i]});
  }
  return Median(slowest);
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "collective_bench: %s\n", what.c_str());
  _exit(1);
}

// --- Loopback TCP: the physical limit the collectives are measured against.

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = write(fd, p, n);
    if (k <= 0) Die("loopback write failed");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t k = read(fd, p, n);
    if (k <= 0) Die("loopback read failed");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

// A connected pair of loopback TCP sockets: {listener side, connector side}.
std::pair<int, int> LoopbackPair() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) Die("cannot make a loopback socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Die("cannot listen on loopback");
  }
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  if (client < 0 || connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    Die("cannot connect on loopback");
  }
  const int server = accept(listener, nullptr, nullptr);
  if (server < 0) Die("cannot accept on loopback");
  close(listener);
  SetNoDelay(server);
  SetNoDelay(client);
  return {server, client};
}

// Round trip of `bytes` between two processes (median of `rounds`), and one-way bandwidth.
void MeasureLoopback() {
  auto [server, client] = LoopbackPair();
  const pid_t echo = fork();
  if (echo == 0) {
    close(client);
    std::vector<char> buf(size_t{4} << 20);
    for (;;) {
      uint64_t n = 0;
      if (read(server, &n, sizeof(n)) != sizeof(n)) _exit(0);
      if (n == UINT64_MAX) {  // bandwidth: swallow what follows, then acknowledge
        uint64_t total = 0;
        ReadAll(server, reinterpret_cast<char*>(&total), sizeof(total));
        for (uint64_t got = 0; got < total;) {
          const ssize_t k = read(server, buf.data(), std::min<uint64_t>(buf.size(), total - got));
          if (k <= 0) _exit(1);
          got += static_cast<uint64_t>(k);
        }
        WriteAll(server, "k", 1);
        continue;
      }
      ReadAll(server, buf.data(), n);
      WriteAll(server, buf.data(), n);
    }
  }
  close(server);
  std::vector<char> buf(size_t{4} << 20, 1);
  for (uint64_t bytes : {uint64_t{1}, uint64_t{4096}, uint64_t{65536}}) {
    std::vector<double> rtt;
    for (int i = 0; i < 2000; ++i) {
      const auto start = Clock::now();
      WriteAll(client, reinterpret_cast<const char*>(&bytes), sizeof(bytes));
      WriteAll(client, buf.data(), bytes);
      ReadAll(client, buf.data(), bytes);
      rtt.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
    std::printf("{\"kind\": \"loopback_rtt\", \"bytes\": %llu, \"rtt_us\": %.1f}\n",
                static_cast<unsigned long long>(bytes), Median(rtt) * 1e6);
  }
  const uint64_t total = uint64_t{1} << 30, marker = UINT64_MAX;
  const auto start = Clock::now();
  WriteAll(client, reinterpret_cast<const char*>(&marker), sizeof(marker));
  WriteAll(client, reinterpret_cast<const char*>(&total), sizeof(total));
  for (uint64_t sent = 0; sent < total; sent += buf.size())
    WriteAll(client, buf.data(), buf.size());
  char ack = 0;
  ReadAll(client, &ack, 1);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("{\"kind\": \"loopback_bandwidth\", \"gb_per_s\": %.2f}\n",
              static_cast<double>(total) / seconds / 1e9);
  std::fflush(stdout);
  close(client);
  waitpid(echo, nullptr, 0);
}

// The bare all-to-all exchange of 4 KiB among `world` processes over loopback TCP, no framing and
// no polling: each writes 4 KiB to every other, then reads every other's in rank order, blocking.
// What an inline collective (one exchange) cannot beat on this machine; at more ranks than cores
// most of it is processes waiting for a core, which a two-process round trip never shows. An
// iteration takes what its slowest process took; the median iteration counts.
void MeasureExchange(int64_t world) {
  constexpr size_t kBytes = 4096;
  constexpr int kWarmup = 100, kIterations = 2000;
  const auto w = static_cast<size_t>(world);
  std::vector<std::vector<int>> fds(w, std::vector<int>(w, -1));  // fds[r][q]: r's end to q
  for (size_t r = 0; r < w; ++r) {
    for (size_t q = r + 1; q < w; ++q) std::tie(fds[r][q], fds[q][r]) = LoopbackPair();
  }
  std::vector<int> results;  // read ends of each process's pipe of per-iteration times
  std::vector<pid_t> pids;
  for (size_t r = 0; r < w; ++r) {
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) Die("pipe failed");
    const pid_t pid = fork();
    if (pid < 0) Die("fork failed");
    if (pid == 0) {
      // Only its own sockets: a peer that dies must leave the others an EOF, not a hang.
      close(pipe_fds[0]);
      for (int fd : results) close(fd);
      for (size_t other = 0; other < w; ++other) {
        for (int fd : fds[other]) {
          if (other != r && fd >= 0) close(fd);
        }
      }
      std::vector<char> out(kBytes, 1), in(kBytes);
      std::vector<float> times;
      for (int i = 0; i < kWarmup + kIterations; ++i) {
        const auto t0 = Clock::now();
        for (size_t q = 0; q < w; ++q) {
          if (q != r) WriteAll(fds[r][q], out.data(), kBytes);
        }
        for (size_t q = 0; q < w; ++q) {
          if (q != r) ReadAll(fds[r][q], in.data(), kBytes);
        }
        const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
        if (i >= kWarmup) times.push_back(static_cast<float>(us));
      }
      WriteAll(pipe_fds[1], reinterpret_cast<const char*>(times.data()),
               times.size() * sizeof(float));
      _exit(0);
    }
    close(pipe_fds[1]);
    results.push_back(pipe_fds[0]);
    pids.push_back(pid);
  }
  for (auto& row : fds) {
    for (int fd : row) {
      if (fd >= 0) close(fd);
    }
  }
  std::vector<float> times(w * kIterations);
  for (size_t r = 0; r < w; ++r) {
    ReadAll(results[r], reinterpret_cast<char*>(times.data() + r * kIterations),
            kIterations * sizeof(float));
    close(results[r]);
    waitpid(pids[r], nullptr, 0);
  }
  std::printf(
      "{\"kind\": \"loopback_exchange\", \"world\": %lld, \"bytes\": %zu, \"time_us\": %.1f}\n",
      static_cast<long long>(world), kBytes, MedianOfSlowest(times, w));
  std::fflush(stdout);
}

// --- The collectives.

struct Op {
  const char* name;
  std::function<std::unique_ptr<comm::Work>(comm::Communicator&, char*, int64_t elements)> run;
  bool chunked;          // the buffer is world chunks
  bool grouped = false;  // the buffer is cut into --group buffers
};

// The buffer of n elements cut into `buffers` reduce-scatter (all-gather) buffers of world chunks
// each, as the engine cuts a step's gradients into segments.
int64_t group_buffers = 8;          // --group
DType dtype = DType::kFloat32;      // --dtype
std::vector<std::string> only_ops;  // --ops (empty: every op)

std::vector<comm::ChunkedBuffer> Cut(comm::Communicator& c, char* d, int64_t n, int64_t buffers) {
  std::vector<comm::ChunkedBuffer> group;
  const int64_t chunk = n / c.world_size() / buffers;
  for (int64_t b = 0; b < buffers; ++b) {
    group.push_back({d + b * chunk * c.world_size() * DTypeBytes(dtype), chunk});
  }
  return group;
}

std::vector<Op> Ops() {
  std::vector<Op> ops = {
      {"all_reduce",
       [](comm::Communicator& c, char* d, int64_t n) { return c.AllReduce(d, n, dtype); }, false},
      {"reduce_scatter",
       [](comm::Communicator& c, char* d, int64_t n) {
         return c.ReduceScatter(d, n / c.world_size(), dtype);
       },
       true},
      {"all_gather",
       [](comm::Communicator& c, char* d, int64_t n) {
         return c.AllGather(d, n / c.world_size(), dtype);
       },
       true},
      {"broadcast",
       [](comm::Communicator& c, char* d, int64_t n) { return c.Broadcast(d, n, dtype, 0); },
       false},
      // A group issued as one collective, and the same buffers one collective each (the
      // Communicator's default ReduceScatterGroup), as the engine issued a step's segments before.
      {"reduce_scatter_grouped",
       [](comm::Communicator& c, char* d, int64_t n) {
         return c.ReduceScatterGroup(Cut(c, d, n, group_buffers), dtype);
       },
       true, true},
      {"reduce_scatter_separately",
       [](comm::Communicator& c, char* d, int64_t n) {
         return c.Communicator::ReduceScatterGroup(Cut(c, d, n, group_buffers), dtype);
       },
       true, true},
      {"all_gather_grouped",
       [](comm::Communicator& c, char* d, int64_t n) {
         return c.AllGatherGroup(Cut(c, d, n, group_buffers), dtype);
       },
       true, true},
      {"all_gather_separately",
       [](comm::Communicator& c, char* d, int64_t n) {
         return c.Communicator::AllGatherGroup(Cut(c, d, n, group_buffers), dtype);
       },
       true, true},
  };
  if (group_buffers <= 1) ops.resize(4);
  if (!only_ops.empty()) {
    // A grouped op goes with its op ("reduce_scatter" takes "reduce_scatter_grouped" along).
    std::erase_if(ops, [](const Op& op) {
      return std::none_of(only_ops.begin(), only_ops.end(), [&](const std::string& name) {
        return std::string(op.name).starts_with(name);
      });
    });
  }
  return ops;
}

void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) Die(std::string(what) + ": " + std::string(s.message()));
}

// Times `body` (one collective, waited for) until `min_time` has passed on rank 0; every rank runs
// the same number of iterations (rank 0 decides and broadcasts it). An iteration takes as long as
// its slowest rank took (every rank's times are gathered): rank 0's own time alone would flatter an
// algorithm whose root hands its data to the kernel and starts the next one while the others still
// receive. The median iteration counts.
double TimeIt(comm::Communicator& c, double min_time, const std::function<void()>& body) {
  for (int i = 0; i < 3; ++i) body();
  const auto start = Clock::now();
  body();
  const double once = std::chrono::duration<double>(Clock::now() - start).count();
  float iterations = static_cast<float>(std::clamp(min_time / std::max(once, 1e-7), 5.0, 2000.0));
  Check(c.Broadcast(&iterations, 1, DType::kFloat32, 0)->Wait(absl::Seconds(120)), "broadcast");
  const auto n = static_cast<int64_t>(iterations);
  // Microseconds as fp32 (7 digits), each rank's in its chunk, gathered after the timed loop.
  std::vector<float> times(static_cast<size_t>(n * c.world_size()));
  float* mine = times.data() + c.rank() * n;
  for (int64_t i = 0; i < n; ++i) {
    const auto t0 = Clock::now();
    body();
    mine[i] =
        static_cast<float>(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  Check(c.AllGather(times.data(), n, DType::kFloat32)->Wait(absl::Seconds(120)), "all_gather");
  return MedianOfSlowest(times, static_cast<size_t>(c.world_size())) * 1e-6;
}

void RunRank(const std::string& store_dir, int64_t rank, int64_t world,
             const std::vector<int64_t>& sizes, double min_time, const comm::GlooOptions& options) {
  auto store = std::make_shared<comm::FileStore>(store_dir);
  auto created = comm::GlooCommunicator::Create(store, rank, world, options);
  Check(created.status(), "connect");
  comm::GlooCommunicator& gloo = **created;
  comm::Communicator& c = gloo;
  const double lead =
      TimeIt(c, min_time, [&] { Check(c.Barrier()->Wait(absl::Seconds(120)), "barrier"); });
  if (rank == 0) {
    std::printf("{\"kind\": \"lead\", \"impl\": \"zerod\", \"world\": %lld, \"time_us\": %.1f}\n",
                static_cast<long long>(world), lead * 1e6);
  }
  for (int64_t size : sizes) {
    const int64_t elements = size / DTypeBytes(dtype);
    // Zeros: the sums stay zero in every dtype however many iterations run.
    std::vector<char> data(static_cast<size_t>(size), 0);
    for (const Op& op : Ops()) {
      const auto waits_before = gloo.LeadWaits();
      const double t = TimeIt(c, min_time, [&] {
        Check(op.run(c, data.data(), elements)->Wait(absl::Seconds(120)), op.name);
      });
      const auto waits_after = gloo.LeadWaits();
      // What one collective moves to each peer (each of a group issued one by one moves its part).
      const bool one_by_one = op.grouped && std::string(op.name).ends_with("separately");
      const int64_t per_peer =
          (op.chunked ? size / world : size) / (one_by_one ? group_buffers : 1);
      using Exchange = comm::internal::LeadExchange;
      const bool all_to_all = world <= options.lead_all_to_all_max_world;
      const bool broadcast = std::string(op.name) == "broadcast";
      const int64_t shared_memory_min =
          gloo.UsesSharedMemory() ? comm::GlooCommunicator::SharedMemoryMinBytes(options, world)
                                  : -1;
      const auto route =
          Exchange::RouteOf(static_cast<size_t>(per_peer), world, all_to_all, shared_memory_min);
      // An all-reduce goes inline in one exchange or two, as the communicator decides.
      using AllReduceRoute = comm::GlooCommunicator::AllReduceRoute;
      const AllReduceRoute all_reduce_route = comm::GlooCommunicator::AllReduceRouteOf(
          elements, dtype, world, options, gloo.UsesSharedMemory());
      // Buffers of this rank's together (a group's too) from the minimum up.
      const bool shared_memory = broadcast ? route == Exchange::BroadcastRoute::kSharedMemory
                                           : shared_memory_min >= 0 && size >= shared_memory_min;
      const bool inline_path =
          shared_memory ? false
          : broadcast   ? route == Exchange::BroadcastRoute::kInline
          : std::string(op.name) == "all_reduce"
              ? all_reduce_route == AllReduceRoute::kOneExchange ||
                    all_reduce_route == AllReduceRoute::kTwoExchanges
              : all_to_all && static_cast<size_t>(per_peer) <=
                                  Exchange::MaxInlineBytes(
                                      std::string(op.name).starts_with("all_gather")
                                          ? comm::internal::CollectiveKind::kAllGather
                                          : comm::internal::CollectiveKind::kReduceScatter,
                                      world);
      // A broadcast along the chain has sparse leads: no lead exchange (barrier) of its own.
      const bool chain = broadcast && route == Exchange::BroadcastRoute::kChain;
      if (rank == 0) {
        std::printf(
            "{\"kind\": \"collective\", \"impl\": \"zerod\", \"op\": \"%s\", \"world\": %lld, "
            "\"bytes\": %lld, \"time_us\": %.1f, \"inline\": %s, \"chain\": %s, "
            "\"shared_memory\": %s, "
            "\"lead_share\": %.3f, \"buffers\": %lld, \"lead_waits_spun\": %lld, "
            "\"lead_waits_slept\": %lld}\n",
            op.name, static_cast<long long>(world), static_cast<long long>(size), t * 1e6,
            inline_path ? "true" : "false", chain ? "true" : "false",
            shared_memory ? "true" : "false", inline_path || chain ? 0.0 : lead / t,
            static_cast<long long>(op.grouped ? group_buffers : 1),
            static_cast<long long>(waits_after.spun - waits_before.spun),
            static_cast<long long>(waits_after.slept - waits_before.slept));
        std::fflush(stdout);
      }
    }
  }
}

std::vector<int64_t> ParseList(const std::string& text, bool sizes) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    if (sizes) {
      auto bytes = ParseBytes(part);
      if (!bytes.ok() || *bytes <= 0) Die("--sizes: bad size '" + std::string(part) + "'");
      out.push_back(*bytes);
    } else {
      int64_t v = 0;
      if (!absl::SimpleAtoi(part, &v) || v < 1 || v > 64) {
        Die("--worlds: bad world size '" + std::string(part) + "'");
      }
      out.push_back(v);
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("collective_bench: Gloo collectives among local processes, beside loopback TCP");
  std::string worlds_text = "2,3,4";
  std::string sizes_text = "4KiB,16KiB,64KiB,256KiB,1MiB,4MiB,16MiB,64MiB";
  double min_time = 0.3;
  bool no_loopback = false;
  std::string split_text;
  app.add_option("--worlds", worlds_text, "Comma-separated world sizes");
  app.add_option("--sizes", sizes_text, "Comma-separated buffer sizes");
  app.add_option("--min-time", min_time, "Seconds each size runs for (at least 5 iterations)");
  std::string dtype_text = "fp32";
  app.add_option("--dtype", dtype_text, "Element type: fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--group", group_buffers,
                 "Buffers a grouped reduce-scatter and all-gather are cut into (measured grouped "
                 "and one by one; 1: not measured)")
      ->check(CLI::Range(1, 64));
  std::string ops_text;
  app.add_option("--ops", ops_text,
                 "Comma-separated ops to measure (all_reduce, reduce_scatter, all_gather, "
                 "broadcast; default every one)");
  app.add_flag("--no-loopback", no_loopback, "Skip the loopback TCP measurements");
  app.add_option("--split-all-reduce-max", split_text,
                 "GlooOptions::split_all_reduce_max_bytes (1: Gloo's all-reduce above the inline "
                 "sizes), to measure the cross-over");
  std::string shared_memory_text;
  app.add_option("--shared-memory-min", shared_memory_text,
                 "GlooOptions::shared_memory_min_bytes, or 'off' for TCP only, to measure the "
                 "cross-over");
  CLI11_PARSE(app, argc, argv);
  comm::GlooOptions options;
  options.timeout = absl::Seconds(120);
  if (!split_text.empty()) {
    auto bytes = ParseBytes(split_text);
    if (!bytes.ok() || *bytes < 0) Die("--split-all-reduce-max: bad size '" + split_text + "'");
    options.split_all_reduce_max_bytes = *bytes;
  }
  if (shared_memory_text == "off") {
    options.shared_memory = false;
  } else if (!shared_memory_text.empty()) {
    auto bytes = ParseBytes(shared_memory_text);
    if (!bytes.ok() || *bytes < 0) {
      Die("--shared-memory-min: bad size '" + shared_memory_text + "'");
    }
    options.shared_memory_min_bytes = *bytes;
  }
  dtype = dtype_text == "bf16"   ? DType::kBFloat16
          : dtype_text == "fp16" ? DType::kFloat16
                                 : DType::kFloat32;
  for (absl::string_view name : absl::StrSplit(ops_text, ',', absl::SkipEmpty())) {
    if (name != "all_reduce" && name != "reduce_scatter" && name != "all_gather" &&
        name != "broadcast") {
      Die("--ops: unknown op '" + std::string(name) + "'");
    }
    only_ops.emplace_back(name);
  }
  const std::vector<int64_t> worlds = ParseList(worlds_text, false);
  const std::vector<int64_t> sizes = ParseList(sizes_text, true);
  if (!no_loopback) MeasureLoopback();
  for (int64_t world : worlds) {
    // Up to the inline collectives' limit: the parent holds every pair's sockets.
    if (!no_loopback && world > 1 && world <= comm::GlooOptions{}.lead_all_to_all_max_world) {
      MeasureExchange(world);
    }
    std::string dir = (std::filesystem::temp_directory_path() / "collective_bench_XXXXXX").string();
    if (mkdtemp(dir.data()) == nullptr) Die("cannot make a temporary directory");
    std::vector<pid_t> ranks;
    for (int64_t r = 0; r < world; ++r) {
      const pid_t pid = fork();
      if (pid < 0) Die("fork failed");
      if (pid == 0) {
        RunRank(dir, r, world, sizes, min_time, options);
        std::fflush(stdout);
        _exit(0);
      }
      ranks.push_back(pid);
    }
    bool failed = false;
    for (pid_t pid : ranks) {
      int status = 0;
      waitpid(pid, &status, 0);
      failed |= !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    std::filesystem::remove_all(dir);
    if (failed) Die("a rank failed (world " + std::to_string(world) + ")");
  }
  return 0;
}
