// The CPU compute threads: a persistent pool, pinned one thread per core with hwloc, that runs a
// range of tasks taken dynamically from one shared counter. The forward pass cuts each piece of
// work (the row chunks of a matmul, the row chunks of all active experts of a layer) into tasks,
// so uneven work (skewed expert routing) stays balanced, and a whole layer's experts cost one
// dispatch, not one fork/join per matrix.
//
// Waiting: a worker spins for a few hundred microseconds after its last task (the gaps between
// the dispatches of one token are shorter than that), then sleeps on a futex (std::atomic::wait),
// so an idle pool costs no CPU. The caller of run() waits only for tasks that were started, never
// for a worker that has not woken up.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace strata::cpu {

class ThreadPool {
 public:
  // n_threads counts the caller of run() (thread 0) and n_threads - 1 workers. With pin, thread i
  // is bound to core i (hwloc; silently unpinned where binding fails).
  ThreadPool(int n_threads, bool pin);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

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
    dispatch(Job{n_tasks, const_cast<void*>(static_cast<const void*>(&fn)),
                 [](void* ctx, int64_t task, int thread) { (*static_cast<Fn*>(ctx))(task, thread); }});
  }

 private:
  struct Job {
    int64_t n_tasks = 0;
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
  // by a compare-and-swap on ticket_ = (job number, task count, next task index) in one word; the
  // job's other fields are read only after a successful claim, when the job cannot have ended (it
  // waits for the claimed task) and so cannot have been replaced. A late worker's claim fails on
  // the job number; a worker that sees a finished job's ticket finds no task left in it.
  const int n_threads_;
  std::mutex run_mutex_;  // one job at a time
  std::atomic<void*> ctx_{nullptr};
  std::atomic<void (*)(void*, int64_t, int)> call_{nullptr};
  alignas(64) std::atomic<uint64_t> ticket_{0};
  alignas(64) std::atomic<int64_t> done_{0};          // tasks of the current job finished
  alignas(64) std::atomic<uint32_t> wake_{0};         // bumped once per job (and at shutdown)
  std::atomic<int> sleepers_{0};                      // workers in (or entering) a futex wait
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
};

// The pool the forward pass uses. Created at first use with set_compute_threads()'s count, or one
// thread per physical core; pinned unless set_compute_pin(false) or STRATA_PIN=0.
ThreadPool& compute_pool();
// Sets the thread count of compute_pool(); only before its first use (checked). n >= 1.
void set_compute_threads(int n);
// Whether compute_pool() pins its threads (default yes; STRATA_PIN=0 in the environment always
// unpins). Only before its first use (checked).
void set_compute_pin(bool pin);
// Physical cores of this machine (hwloc), at least 1.
int physical_cores();

}  // namespace strata::cpu
