// The CPU compute threads: a persistent pool, pinned one thread per core with hwloc, that runs a
// range of tasks taken dynamically from one shared counter. The forward pass cuts each piece of
// work (the row chunks of a matmul, the row chunks of all active experts of a layer) into tasks,
// so uneven work (skewed expert routing) stays balanced, and a whole layer's experts cost one
// dispatch, not one fork/join per matrix.
//
// NUMA: every thread belongs to a group (its node, cpu/numa.h). run_grouped() gives each group
// its own tasks, taken only by that group's threads; run() lets any thread take any task.
//
// Waiting: a worker spins for a few hundred microseconds after its last task (the gaps between
// the dispatches of one token are shorter than that), then sleeps on a futex (std::atomic::wait),
// so an idle pool costs no CPU. The caller of run() waits only for tasks that were started, never
// for a worker that has not woken up.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/error.h"

namespace strata::cpu {

class ThreadPool {
 public:
  // n_threads counts the caller of run() (thread 0) and n_threads - 1 workers. With pin, thread i
  // is bound to core i (hwloc; silently unpinned where binding fails).
  ThreadPool(int n_threads, bool pin);
  // n = groups.size() threads; thread i in group groups[i] (every group 0..max must have a thread),
  // workers started with on_start(i) (pinning) when given. The caller of run() is thread 0 and is
  // never pinned (threads it starts later, OpenMP's among them, inherit its mask).
  ThreadPool(std::vector<int> groups, const std::function<void(int thread)>& on_start);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Whether the calling thread is running a task of some pool (a run from it is serial).
  static bool in_pool() { return tl_in_pool; }
  int n_groups() const { return n_groups_.load(std::memory_order_relaxed); }
  int group_of(int thread) const { return group_[size_t(thread)].load(std::memory_order_relaxed); }
  // Regroups the threads (same rules as the constructor; waits for a run in progress).
  void set_groups(const std::vector<int>& groups);

  // Calls fn(task, thread) for every task in [0, n_tasks), thread in [0, size()), on the pool's
  // threads and the caller, and returns when every call has returned. Tasks start in increasing
  // order; each thread owns its `thread` index for the duration of a call (per-thread scratch).
  // One run at a time per pool (others wait); a run() from inside fn runs its tasks serially on
  // the calling thread. fn must not throw. At most 2^24 - 1 tasks per run (checked).
  template <class F>
  void run(int64_t n_tasks, F&& fn) {
    if (n_tasks <= 0) return;
    if (n_threads_ == 1 || n_tasks == 1 || tl_in_pool) {
      for (int64_t t = 0; t < n_tasks; ++t) fn(t, tl_in_pool ? tl_thread : 0);
      return;
    }
    using Fn = std::remove_reference_t<F>;
    const int64_t starts[2] = {0, n_tasks};
    dispatch(Job{starts, 1, false, const_cast<void*>(static_cast<const void*>(&fn)),
                 [](void* ctx, int64_t task, int thread) { (*static_cast<Fn*>(ctx))(task, thread); }});
  }

  // Like run(), with tasks by group: group g's are [starts[g], starts[g + 1]) and run only on
  // threads of group g (starts.size() == n_groups() + 1, non-decreasing from 0). A run_grouped()
  // from inside fn, or on a one-thread pool, runs its tasks serially on the calling thread in
  // index order (so a task must not wait for a later group's: see in_pool()).
  template <class F>
  void run_grouped(const std::vector<int64_t>& starts, F&& fn) {
    STRATA_CHECK(int(starts.size()) == n_groups() + 1 && starts.front() == 0, "run_grouped: one range per group");
    const int64_t n_tasks = starts.back();
    if (n_tasks <= 0) return;
    if (n_threads_ == 1 || tl_in_pool || n_groups() == 1) {
      run(n_tasks, std::forward<F>(fn));
      return;
    }
    using Fn = std::remove_reference_t<F>;
    dispatch(Job{starts.data(), int(starts.size()) - 1, true, const_cast<void*>(static_cast<const void*>(&fn)),
                 [](void* ctx, int64_t task, int thread) { (*static_cast<Fn*>(ctx))(task, thread); }});
  }

 private:
  struct Job {
    const int64_t* starts = nullptr;  // n_ranges + 1 entries: {0, n} (run) or one range per group
    int n_ranges = 1;
    bool grouped = false;
    void* ctx = nullptr;
    void (*call)(void* ctx, int64_t task, int thread) = nullptr;
  };
  void dispatch(const Job& job);
  // Claims and runs tasks of the current job until none is left.
  void work(int thread);
  void worker_main(int thread);

  static thread_local bool tl_in_pool;
  static thread_local int tl_thread;

  // How a job is shared without making the caller wait for workers that never woke up (a busy or
  // oversubscribed machine): the caller waits for its tasks, not for its workers. A task is claimed
  // by a compare-and-swap on a ticket = (job number, grouped, end, next task index) in one word;
  // the job's other fields are read only after a successful claim, when the job cannot have ended
  // (it waits for the claimed task) and so cannot have been replaced. A late worker's claim fails
  // on the job number; a worker that sees a finished job's ticket finds no task left in it.
  // run() fills ticket 0 alone (the others empty); run_grouped() one ticket per group, marked
  // grouped, so that a thread that reads ticket 0 of a grouped job moves to its own group's.
  // Tickets other than 0 are written before ticket 0 (release): a thread that saw ticket 0 of a
  // job sees that job's (or a later job's) other tickets.
  struct alignas(64) Ticket {
    std::atomic<uint64_t> v{0};
  };
  const int n_threads_;
  std::unique_ptr<std::atomic<int>[]> group_;  // each thread's group
  std::atomic<int> n_groups_{1};
  std::unique_ptr<Ticket[]> tickets_;         // one per possible group (n_threads_)
  std::mutex run_mutex_;  // one job at a time
  std::atomic<void*> ctx_{nullptr};
  std::atomic<void (*)(void*, int64_t, int)> call_{nullptr};
  alignas(64) std::atomic<int64_t> done_{0};          // tasks of the current job finished
  alignas(64) std::atomic<uint32_t> wake_{0};         // bumped once per job (and at shutdown)
  std::atomic<int> sleepers_{0};                      // workers in (or entering) a futex wait
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
};

// The pool the forward pass uses. Created at first use from numa_layout() (cpu/numa.h): its
// threads (set_compute_threads()'s count, or one per core), their groups, and their cores; pinned
// unless set_compute_pin(false) or STRATA_PIN=0 (or the layout's topology is a stand-in).
ThreadPool& compute_pool();
// compute_pool()'s size once it started; 0 before.
int compute_pool_threads();
// set_compute_threads()'s count; 0: not set (one thread per core).
int requested_compute_threads();
// Sets the thread count of compute_pool(); only before its first use (checked). n >= 1.
void set_compute_threads(int n);
// Whether compute_pool() pins its threads (default yes; STRATA_PIN=0 in the environment always
// unpins). Only before its first use (checked).
void set_compute_pin(bool pin);
// Physical cores of this machine (hwloc), at least 1.
int physical_cores();

}  // namespace strata::cpu
