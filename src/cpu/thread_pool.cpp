#include "cpu/thread_pool.h"

#include <hwloc.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "base/error.h"

namespace strata::cpu {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins of a waiting worker before it sleeps: ~50 us of pause instructions on current x86.
constexpr int kSpinsBeforeSleep = 20000;

// The hwloc topology, loaded once.
hwloc_topology_t topology() {
  static hwloc_topology_t topo = [] {
    hwloc_topology_t t = nullptr;
    if (hwloc_topology_init(&t) != 0) return hwloc_topology_t(nullptr);
    if (hwloc_topology_load(t) != 0) {
      hwloc_topology_destroy(t);
      return hwloc_topology_t(nullptr);
    }
    return t;
  }();
  return topo;
}

// Binds the calling thread to core `index` (modulo the cores); false where that fails.
bool pin_current_thread(int index) {
  hwloc_topology_t t = topology();
  if (t == nullptr) return false;
  const int n_cores = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE);
  if (n_cores <= 0) return false;
  hwloc_obj_t core = hwloc_get_obj_by_type(t, HWLOC_OBJ_CORE, unsigned(index % n_cores));
  if (core == nullptr || core->cpuset == nullptr) return false;
  return hwloc_set_cpubind(t, core->cpuset, HWLOC_CPUBIND_THREAD) == 0;
}

}  // namespace

thread_local bool ThreadPool::tl_in_pool = false;
thread_local int ThreadPool::tl_thread = 0;

ThreadPool::ThreadPool(int n_threads, bool pin) : n_threads_(n_threads) {
  STRATA_CHECK(n_threads >= 1, "a thread pool needs at least one thread");
  workers_.reserve(size_t(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) {
    workers_.emplace_back([this, i, pin] {
      if (pin) pin_current_thread(i);
      worker_main(i);
    });
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::work(int thread) {
  const Job job = job_;
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= job.n_tasks) return;
    job.call(job.ctx, task, thread);
  }
}

void ThreadPool::worker_main(int thread) {
  tl_in_pool = true;
  tl_thread = thread;
  uint32_t seen = 0;
  for (;;) {
    uint32_t g;
    for (int spins = 0; (g = generation_.load(std::memory_order_acquire)) == seen; ++spins) {
      if (spins < kSpinsBeforeSleep) cpu_relax();
      else generation_.wait(seen, std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_relaxed)) return;
    work(thread);
    busy_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::dispatch(const Job& job) {
  std::lock_guard lock(run_mutex_);
  job_ = job;
  next_task_.store(0, std::memory_order_relaxed);
  busy_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  tl_in_pool = true;
  tl_thread = 0;
  work(0);
  tl_in_pool = false;
  // The workers are finishing their last tasks (or waking up to find none left).
  for (int spins = 0; busy_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kSpinsBeforeSleep) cpu_relax();
    else std::this_thread::yield();
  }
}

int physical_cores() {
  hwloc_topology_t t = topology();
  const int n = t ? hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE) : 0;
  if (n > 0) return n;
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? int(hc) : 1;
}

namespace {

std::atomic<int> g_requested_threads{0};
std::atomic<bool> g_pool_created{false};

}  // namespace

void set_compute_threads(int n) {
  STRATA_CHECK(n >= 1, "thread count must be at least 1");
  STRATA_CHECK(!g_pool_created.load(), "set_compute_threads after the compute pool started");
  g_requested_threads.store(n);
}

ThreadPool& compute_pool() {
  static ThreadPool pool = [] {
    g_pool_created.store(true);
    const int requested = g_requested_threads.load();
    const char* pin_env = std::getenv("STRATA_PIN");
    const bool pin = !(pin_env != nullptr && std::strcmp(pin_env, "0") == 0);
    return ThreadPool(requested > 0 ? requested : physical_cores(), pin);
  }();
  return pool;
}

}  // namespace strata::cpu
