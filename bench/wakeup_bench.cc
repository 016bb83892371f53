// wakeup_bench: what waking a thread costs on this machine, the figures behind the Gloo
// communicator's collective-thread design (runtime/comm/gloo/gloo_communicator.h: it sleeps on a
// timerfd set to a collective's grace, 5 ms by default, and callers spin briefly on their leads,
// yielding their CPU between polls, before they sleep). Prints one JSON object per line:
//
//   timerfd_set_stop  setting a timerfd `delay_us` ahead and stopping it again before it fires, as
//                     a queued collective that a caller then runs itself does: ns per pair.
//                     Near-term timers cost more (the kernel programs the clock event device).
//   timerfd_fire      sleeping in read() on a timerfd set `delay_us` ahead: how late it woke.
//   handoff           one thread hands a token to another and waits for it back, the other
//                     sleeping on a condition variable, blocking in read() on an eventfd, or
//                     spinning on an atomic (the floor: no sleep at all): one-way time. Back to
//                     back, neither CPU ever idles.
//   idle_wake         a thread asleep on a condition variable for `idle_us` (its CPU idle, while
//                     the waker spins) is handed a token: the time until it runs. What a rank's
//                     thread pays to be woken for a message after a pause, which a spinning
//                     wait saves.
//
//   build/bin/wakeup_bench [--delays 50,200,1000,2000,5000] [--pairs 20000] [--handoffs 20000]
//
// The spinning handoff is the peer each sleeping one is measured against in the same run; figures
// from past runs are in bench/RESULTS.md.

#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    std::exit(1);
  }
}

itimerspec After(std::chrono::nanoseconds delay) {
  itimerspec spec{};
  spec.it_value.tv_sec = static_cast<time_t>(delay.count() / 1000000000);
  spec.it_value.tv_nsec = static_cast<long>(delay.count() % 1000000000);
  return spec;
}

// Set `delay` ahead (relative) and stopped, `pairs` times: mean ns per pair.
void MeasureSetStop(int fd, std::chrono::microseconds delay, int pairs) {
  const itimerspec arm = After(delay), disarm{};
  const auto start = Clock::now();
  for (int i = 0; i < pairs; ++i) {
    Check(timerfd_settime(fd, 0, &arm, nullptr) == 0, "timerfd_settime");
    Check(timerfd_settime(fd, 0, &disarm, nullptr) == 0, "timerfd_settime");
  }
  const double ns = std::chrono::duration<double, std::nano>(Clock::now() - start).count();
  std::printf("{\"kind\": \"timerfd_set_stop\", \"delay_us\": %lld, \"ns_per_pair\": %.0f}\n",
              static_cast<long long>(delay.count()), ns / pairs);
}

// Slept on a timerfd set `delay` ahead, `times` times: the median lateness in microseconds.
void MeasureFire(int fd, std::chrono::microseconds delay, int times) {
  const itimerspec arm = After(delay);
  std::vector<double> late;
  for (int i = 0; i < times; ++i) {
    const auto due = Clock::now() + delay;
    Check(timerfd_settime(fd, 0, &arm, nullptr) == 0, "timerfd_settime");
    uint64_t expirations = 0;
    Check(read(fd, &expirations, sizeof(expirations)) == sizeof(expirations), "read timerfd");
    late.push_back(std::chrono::duration<double, std::micro>(Clock::now() - due).count());
  }
  std::printf("{\"kind\": \"timerfd_fire\", \"delay_us\": %lld, \"late_us\": %.1f}\n",
              static_cast<long long>(delay.count()), Median(late));
}

// A token passed back and forth between two threads `handoffs` times through `give` (to the
// other thread) and `take` (wait for it back): the median one-way time in microseconds, half of
// each round trip.
struct Channel {
  std::function<void()> give;
  std::function<void()> take;
};

void MeasureHandoff(const char* how, Channel to_peer, Channel to_main, int handoffs) {
  std::thread peer([&] {
    for (int i = 0; i < handoffs; ++i) {
      to_peer.take();
      to_main.give();
    }
  });
  std::vector<double> one_way;
  for (int i = 0; i < handoffs; ++i) {
    const auto start = Clock::now();
    to_peer.give();
    to_main.take();
    one_way.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() / 2);
  }
  peer.join();
  std::printf("{\"kind\": \"handoff\", \"how\": \"%s\", \"one_way_us\": %.2f}\n", how,
              Median(one_way));
}

// A one-slot mailbox a thread sleeps on with a condition variable.
struct CondvarBox {
  std::mutex mu;
  std::condition_variable cv;
  bool full = false;
  Channel AsChannel() {
    return {[this] {
              {
                std::lock_guard<std::mutex> lock(mu);
                full = true;
              }
              cv.notify_one();
            },
            [this] {
              std::unique_lock<std::mutex> lock(mu);
              cv.wait(lock, [this] { return full; });
              full = false;
            }};
  }
};

Channel EventfdChannel(int fd) {
  return {[fd] {
            const uint64_t one = 1;
            Check(write(fd, &one, sizeof(one)) == sizeof(one), "write eventfd");
          },
          [fd] {
            uint64_t got = 0;
            Check(read(fd, &got, sizeof(got)) == sizeof(got), "read eventfd");
          }};
}

Channel SpinChannel(std::atomic<bool>& flag) {
  return {[&flag] { flag.store(true, std::memory_order_release); },
          [&flag] {
            while (!flag.exchange(false, std::memory_order_acquire)) {
            }
          }};
}

// A thread asleep on a condition variable is handed a token after `idle` (the waker spins
// meanwhile, so only the sleeper's CPU can idle), `times` times: the median time from the hand-off
// to the sleeper running, in microseconds.
void MeasureIdleWake(std::chrono::microseconds idle, int times) {
  CondvarBox box;
  Channel to_peer = box.AsChannel();
  std::atomic<int64_t> woke_ns{-1};
  std::thread peer([&] {
    for (int i = 0; i < times; ++i) {
      to_peer.take();
      woke_ns.store(Clock::now().time_since_epoch().count(), std::memory_order_release);
    }
  });
  std::vector<double> wake;
  for (int i = 0; i < times; ++i) {
    const auto until = Clock::now() + idle;
    while (Clock::now() < until) {
    }
    woke_ns.store(-1, std::memory_order_relaxed);
    const auto given = Clock::now();
    to_peer.give();
    int64_t woke = -1;
    while ((woke = woke_ns.load(std::memory_order_acquire)) < 0) {
    }
    wake.push_back(
        std::chrono::duration<double, std::micro>(Clock::duration(woke) - given.time_since_epoch())
            .count());
  }
  peer.join();
  std::printf("{\"kind\": \"idle_wake\", \"idle_us\": %lld, \"wake_us\": %.1f}\n",
              static_cast<long long>(idle.count()), Median(wake));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wakeup_bench: timerfd and thread wake-up costs on this machine"};
  std::vector<int64_t> delays = {50, 200, 1000, 2000, 5000};
  int pairs = 20000, handoffs = 20000;
  app.add_option("--delays", delays, "Timer delays in microseconds")->delimiter(',');
  app.add_option("--pairs", pairs, "Set-and-stop pairs per delay")->check(CLI::PositiveNumber);
  app.add_option("--handoffs", handoffs, "Round trips per handoff kind")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  for (int64_t d : delays) {
    if (d <= 0 || d > 1000000) {
      std::fprintf(stderr, "wakeup_bench: --delays: %lld is not 1-1000000 us\n",
                   static_cast<long long>(d));
      return 2;
    }
  }
  const int timer = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
  Check(timer >= 0, "timerfd_create");
  for (int64_t d : delays) MeasureSetStop(timer, std::chrono::microseconds(d), pairs);
  for (int64_t d : delays) {
    // At most about a second of sleeping per delay.
    const int times = static_cast<int>(std::clamp<int64_t>(1000000 / d, 20, 2000));
    MeasureFire(timer, std::chrono::microseconds(d), times);
  }
  close(timer);
  CondvarBox there, back;
  MeasureHandoff("condvar", there.AsChannel(), back.AsChannel(), handoffs);
  const int there_fd = eventfd(0, EFD_CLOEXEC), back_fd = eventfd(0, EFD_CLOEXEC);
  Check(there_fd >= 0 && back_fd >= 0, "eventfd");
  MeasureHandoff("eventfd", EventfdChannel(there_fd), EventfdChannel(back_fd), handoffs);
  close(there_fd);
  close(back_fd);
  std::atomic<bool> there_flag{false}, back_flag{false};
  MeasureHandoff("spin", SpinChannel(there_flag), SpinChannel(back_flag), handoffs);
  for (const int64_t idle : {100, 1000}) {
    MeasureIdleWake(std::chrono::microseconds(idle), static_cast<int>(500000 / idle + 100));
  }
  return 0;
}
