// hvd_team: the native forward's own threads, in place of OpenMP's.
//
// A decode step is one parallel region with a few hundred barriers (seven a layer), so a barrier
// must cost a microsecond, not a futex wake-up. libgomp spins at a barrier only while the process
// manages no more threads than it has CPUs; it counts the teams of every thread that ever ran an
// OpenMP region, so once the main thread (loading the model) and a worker thread (an async chat
// model's, a batcher's, a server's) have both run one, every barrier of every later step sleeps
// in the kernel: a step of the embedded model took 13-15 ms on a worker thread against 8 ms on the
// main thread on two cores. This team's barriers spin (pausing, then yielding the core), whatever
// thread calls and whatever other threads have run.
//
// One team per process, reused by every call; callers from several threads take turns. The caller
// is thread 0; the other threads spin a little after a region (the next decode step follows within
// a millisecond or two), then sleep until the next one. Work is split as OpenMP's static schedule
// splits it, or handed out one item at a time (dynamic); which thread computes an item never
// changes what is computed.

#pragma once

#include <immintrin.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hvd_team {

inline void relax(int64_t& spins) {
  if (++spins < 4096) {
    _mm_pause();
  } else {
    std::this_thread::yield();  // another thread needs this core (more threads than cores): let it run
  }
}

class Team;

// What a thread of a region sees: its index, the team's size, and the work-sharing loops.
class Ctx {
 public:
  Ctx(Team& team, int tid, int nt);  // at a region's start

  // f(i) for i in [0, n): contiguous chunks of ceil(n / nt), thread t the t-th; then a barrier.
  template <class F>
  void for_static(int64_t n, F&& f) {
    const int64_t chunk = (n + nt - 1) / nt, a = std::min(n, tid * chunk), b = std::min(n, a + chunk);
    for (int64_t i = a; i < b; ++i) f(i);
    barrier();
  }

  // f(i) for i in [0, n), each i taken by the first free thread; then a barrier.
  template <class F>
  void for_dynamic(int64_t n, F&& f);

  void barrier();
  void single(const std::function<void()>& f) {  // f on thread 0, then a barrier
    if (tid == 0) f();
    barrier();
  }

 private:
  Team& team_;
  int64_t dyn_base_ = 0;  // the shared counter's value when this thread's next dynamic loop starts
  bool sense_;            // the barrier's sense as this thread last saw it complete

 public:
  const int tid, nt;
};

class Team {
 public:
  // body(ctx) on `nt` threads, the caller's among them; returns when all are done.
  void run(int nt, const std::function<void(Ctx&)>& body) {
    nt = std::max(1, nt);
    std::lock_guard<std::mutex> turn(turn_);
    count_.store(0, std::memory_order_relaxed);
    next_.store(0, std::memory_order_relaxed);
    if (nt == 1) {  // the caller alone (the workers, if any, stay idle)
      Ctx ctx(*this, 0, 1);
      body(ctx);
      return;
    }
    resize(nt);
    body_ = &body;
    generation_.fetch_add(1);  // sequentially consistent with the sleepers' count (a Dekker pair)
    if (sleeping_.load() > 0) {
      std::lock_guard<std::mutex> lock(wake_);
      wake_cv_.notify_all();
    }
    Ctx ctx(*this, 0, nt);
    body(ctx);
    ctx.barrier();  // every thread is done with the body
    body_ = nullptr;
  }

  ~Team() { stop(); }

  // After fork() the child has the team's memory but not its threads: it starts a new team.
  void forget_threads() {
    for (std::thread& t : workers_) t.detach();
    workers_.clear();
    size_ = 1;
  }

 private:
  friend class Ctx;

  void resize(int nt) {
    if (nt == size_) return;
    stop();
    stopping_.store(false);
    size_ = nt;
    const uint64_t gen = generation_.load();
    for (int t = 1; t < nt; ++t) workers_.emplace_back([this, t, nt, gen] { work(t, nt, gen); });
  }

  void stop() {
    if (workers_.empty()) return;
    stopping_.store(true);
    generation_.fetch_add(1, std::memory_order_release);
    {
      std::lock_guard<std::mutex> lock(wake_);
      wake_cv_.notify_all();
    }
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    size_ = 1;
  }

  void work(int tid, int nt, uint64_t seen) {
    for (;;) {
      seen = wait_for_work(seen);
      if (stopping_.load(std::memory_order_acquire)) return;
      Ctx ctx(*this, tid, nt);
      (*body_)(ctx);
      ctx.barrier();
    }
  }

  // Spin about 2 ms for the next region, then sleep until it comes.
  uint64_t wait_for_work(uint64_t seen) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    int64_t spins = 0;
    for (;;) {
      const uint64_t gen = generation_.load(std::memory_order_acquire);
      if (gen != seen) return gen;
      relax(spins);
      if ((spins & 255) == 0 && std::chrono::steady_clock::now() > until) break;
    }
    std::unique_lock<std::mutex> lock(wake_);
    sleeping_.fetch_add(1);
    wake_cv_.wait(lock, [&] { return generation_.load() != seen; });
    sleeping_.fetch_sub(1);
    return generation_.load();
  }

  std::mutex turn_;  // one region at a time
  std::vector<std::thread> workers_;
  int size_ = 1;
  const std::function<void(Ctx&)>* body_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<int> sleeping_{0};
  std::mutex wake_;
  std::condition_variable wake_cv_;
  // the barrier: arrivals, and the sense flipped by the last to arrive
  std::atomic<int> count_{0};
  std::atomic<bool> sense_{false};
  // the dynamic loops' shared counter (never reset within a region: see Ctx::for_dynamic)
  std::atomic<int64_t> next_{0};
};

inline Ctx::Ctx(Team& team, int tid, int nt)
    : team_(team), sense_(team.sense_.load(std::memory_order_acquire)), tid(tid), nt(nt) {}

inline void Ctx::barrier() {
  // A region of one thread leaves the team's barrier alone: a worker may still be spinning on the last region's
  // final barrier, waiting to see the sense its last arrival flipped, and a caller alone flipping it on and back
  // again meanwhile would leave that worker waiting for a flip it has missed while the next region waits for it.
  if (nt == 1) return;
  sense_ = !sense_;
  if (team_.count_.fetch_add(1, std::memory_order_acq_rel) == nt - 1) {
    team_.count_.store(0, std::memory_order_relaxed);
    team_.sense_.store(sense_, std::memory_order_release);
    return;
  }
  int64_t spins = 0;
  while (team_.sense_.load(std::memory_order_acquire) != sense_) relax(spins);
}

// Every thread's last fetch overshoots by one, so each loop moves the counter by exactly n + nt and
// every thread knows where the next loop's items start without resetting it.
template <class F>
void Ctx::for_dynamic(int64_t n, F&& f) {
  for (;;) {
    const int64_t i = team_.next_.fetch_add(1, std::memory_order_relaxed) - dyn_base_;
    if (i >= n) break;
    f(i);
  }
  dyn_base_ += n + nt;
  barrier();
}

inline Team*& team_slot() {
  static Team* team = new Team();  // never destroyed: workers may outlive static destruction at exit
  return team;
}

inline void after_fork_in_child() {
  team_slot()->forget_threads();
  team_slot() = new Team();  // the old one's mutexes may be held by threads that do not exist here
}

// The process's team.
inline Team& team() {
  static const bool registered = [] {
    pthread_atfork(nullptr, nullptr, after_fork_in_child);
    return true;
  }();
  (void)registered;
  return *team_slot();
}

}  // namespace hvd_team
