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

// Spins of a waiting worker before it sleeps: a few hundred microseconds of pause instructions.
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
  stop_.store(true);
  wake_.fetch_add(1);
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

namespace {

// ticket_ fields: [job number: 16 bits | task count: 24 bits | next task: 24 bits]
constexpr int kTaskBits = 24;
constexpr uint64_t kTaskMask = (uint64_t(1) << kTaskBits) - 1;
constexpr int64_t kMaxTasks = int64_t(kTaskMask);

}  // namespace

void ThreadPool::work(int thread) {
  uint64_t t = ticket_.load(std::memory_order_acquire);
  for (;;) {
    const int64_t task = int64_t(t & kTaskMask);
    const int64_t n_tasks = int64_t((t >> kTaskBits) & kTaskMask);
    if (task >= n_tasks) return;
    if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire))
      continue;  // t reloaded: another thread took the task, or a new job began
    // claimed: the job waits for this task, so its fields are this job's
    call_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed), task, thread);
    done_.fetch_add(1, std::memory_order_release);
    t = ticket_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_main(int thread) {
  tl_in_pool = true;
  tl_thread = thread;
  uint32_t seen = 0;
  for (;;) {
    uint32_t w;
    for (int spins = 0; (w = wake_.load(std::memory_order_acquire)) == seen; ++spins) {
      if (spins < kSpinsBeforeSleep) {
        cpu_relax();
        continue;
      }
      sleepers_.fetch_add(1);
      wake_.wait(seen);  // returns at once if wake_ moved since the load above
      sleepers_.fetch_sub(1);
    }
    seen = w;
    if (stop_.load()) return;
    work(thread);
  }
}

void ThreadPool::dispatch(const Job& job) {
  STRATA_CHECK(job.n_tasks <= kMaxTasks, "too many tasks in one run");
  std::lock_guard lock(run_mutex_);
  ctx_.store(job.ctx, std::memory_order_relaxed);
  call_.store(job.call, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  const uint64_t job_number = (ticket_.load(std::memory_order_relaxed) >> (2 * kTaskBits)) + 1;
  // publishes the fields above; the job number wraps at 2^16, harmlessly (a claim fails unless the
  // whole ticket is unchanged)
  ticket_.store((job_number << (2 * kTaskBits)) | (uint64_t(job.n_tasks) << kTaskBits),
                std::memory_order_release);
  wake_.fetch_add(1);
  if (sleepers_.load() > 0) wake_.notify_all();
  tl_in_pool = true;
  tl_thread = 0;
  work(0);
  tl_in_pool = false;
  // tasks other threads started are finishing
  for (int spins = 0; done_.load(std::memory_order_acquire) != job.n_tasks; ++spins) {
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
std::atomic<bool> g_requested_pin{true};
std::atomic<bool> g_pool_created{false};

}  // namespace

void set_compute_threads(int n) {
  STRATA_CHECK(n >= 1, "thread count must be at least 1");
  STRATA_CHECK(!g_pool_created.load(), "set_compute_threads after the compute pool started");
  g_requested_threads.store(n);
}

void set_compute_pin(bool pin) {
  STRATA_CHECK(!g_pool_created.load(), "set_compute_pin after the compute pool started");
  g_requested_pin.store(pin);
}

ThreadPool& compute_pool() {
  static ThreadPool pool = [] {
    g_pool_created.store(true);
    const int requested = g_requested_threads.load();
    const char* pin_env = std::getenv("STRATA_PIN");
    const bool pin = g_requested_pin.load() && !(pin_env != nullptr && std::strcmp(pin_env, "0") == 0);
    return ThreadPool(requested > 0 ? requested : physical_cores(), pin);
  }();
  return pool;
}

}  // namespace strata::cpu
