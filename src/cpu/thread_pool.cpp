#include "cpu/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "base/error.h"
#include "cpu/numa.h"
#include "cpu/topology.h"

namespace strata::cpu {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins of a waiting worker before it sleeps: a few hundred microseconds of pause instructions.
constexpr int kSpinsBeforeSleep = 20000;

}  // namespace

thread_local bool ThreadPool::tl_in_pool = false;
thread_local int ThreadPool::tl_thread = 0;

ThreadPool::ThreadPool(int n_threads, bool pin)
    : ThreadPool(std::vector<int>(size_t(std::max(n_threads, 0)), 0), [pin](int thread) {
        const Topology* t = Topology::machine();
        if (pin && t != nullptr) t->bind_thread_to_core(thread % t->n_cores());
      }) {}

ThreadPool::ThreadPool(std::vector<int> groups, const std::function<void(int thread)>& on_start)
    : n_threads_(int(groups.size())) {
  STRATA_CHECK(n_threads_ >= 1, "a thread pool needs at least one thread");
  group_ = std::make_unique<std::atomic<int>[]>(size_t(n_threads_));
  tickets_ = std::make_unique<Ticket[]>(size_t(n_threads_));
  set_groups(groups);
  workers_.reserve(size_t(n_threads_ - 1));
  for (int i = 1; i < n_threads_; ++i) {
    workers_.emplace_back([this, i, on_start] {
      if (on_start) on_start(i);
      worker_main(i);
    });
  }
}

void ThreadPool::set_groups(const std::vector<int>& groups) {
  STRATA_CHECK(int(groups.size()) == n_threads_, "one group per thread");
  const int n = *std::max_element(groups.begin(), groups.end()) + 1;
  for (int g = 0; g < n; ++g)
    STRATA_CHECK(std::find(groups.begin(), groups.end(), g) != groups.end(), "every group needs a thread");
  STRATA_CHECK(*std::min_element(groups.begin(), groups.end()) >= 0, "group numbers start at 0");
  std::lock_guard lock(run_mutex_);
  for (int i = 0; i < n_threads_; ++i) group_[size_t(i)].store(groups[size_t(i)], std::memory_order_relaxed);
  n_groups_.store(n, std::memory_order_relaxed);
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  wake_.fetch_add(1);
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

namespace {

// ticket fields: [job number: 15 bits | grouped: 1 bit | end task: 24 bits | next task: 24 bits]
constexpr int kTaskBits = 24;
constexpr uint64_t kTaskMask = (uint64_t(1) << kTaskBits) - 1;
constexpr int64_t kMaxTasks = int64_t(kTaskMask);
constexpr uint64_t kGroupedBit = uint64_t(1) << (2 * kTaskBits);
constexpr int kJobShift = 2 * kTaskBits + 1;

}  // namespace

void ThreadPool::work(int thread) {
  int g = 0;  // the ticket this thread takes from: 0, or its group's in a grouped job
  uint64_t t = tickets_[0].v.load(std::memory_order_acquire);
  for (;;) {
    // read after t (acquire): a regrouping before t's job is seen
    const int want = (t & kGroupedBit) != 0 ? group_[size_t(thread)].load(std::memory_order_relaxed) : 0;
    if (want != g) {
      g = want;
      t = tickets_[size_t(g)].v.load(std::memory_order_acquire);
      continue;
    }
    const int64_t task = int64_t(t & kTaskMask);
    const int64_t end = int64_t((t >> kTaskBits) & kTaskMask);
    if (task >= end) return;
    if (!tickets_[size_t(g)].v.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire))
      continue;  // t reloaded: another thread took the task, or a new job began
    // claimed: the job waits for this task, so its fields are this job's
    call_.load(std::memory_order_relaxed)(ctx_.load(std::memory_order_relaxed), task, thread);
    done_.fetch_add(1, std::memory_order_release);
    t = tickets_[size_t(g)].v.load(std::memory_order_acquire);
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
  const int64_t n_tasks = job.starts[job.n_ranges];
  STRATA_CHECK(n_tasks <= kMaxTasks, "too many tasks in one run");
  std::lock_guard lock(run_mutex_);
  const int n_live = n_groups();  // tickets threads may read: their groups'
  STRATA_CHECK(!job.grouped || job.n_ranges == n_live, "run_grouped: one range per group");
  const int n_tickets = job.grouped ? n_live : 1;
  ctx_.store(job.ctx, std::memory_order_relaxed);
  call_.store(job.call, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  // the job number wraps at 2^15, harmlessly (a claim fails unless the whole ticket is unchanged)
  const uint64_t job_number = ((tickets_[0].v.load(std::memory_order_relaxed) >> kJobShift) + 1) & 0x7fff;
  const uint64_t head = (job_number << kJobShift) | (job.grouped ? kGroupedBit : 0);
  // tickets 1.. first, then ticket 0, which publishes the fields above and the other tickets
  for (int g = n_live - 1; g >= 0; --g) {
    uint64_t v = head;
    if (g < n_tickets) {
      STRATA_CHECK(job.starts[g] <= job.starts[g + 1], "run_grouped: ranges out of order");
      v |= (uint64_t(job.starts[g + 1]) << kTaskBits) | uint64_t(job.starts[g]);
    }
    tickets_[size_t(g)].v.store(v, std::memory_order_release);
  }
  wake_.fetch_add(1);
  if (sleepers_.load() > 0) wake_.notify_all();
  tl_in_pool = true;
  tl_thread = 0;
  work(0);
  tl_in_pool = false;
  // tasks other threads started are finishing (a grouped job: the other groups' tasks, too)
  for (int spins = 0; done_.load(std::memory_order_acquire) != n_tasks; ++spins) {
    if (spins < kSpinsBeforeSleep) cpu_relax();
    else std::this_thread::yield();
  }
}

int physical_cores() {
  const Topology* t = Topology::machine();
  if (t != nullptr) return t->n_cores();
  const unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? int(hc) : 1;
}

namespace {

std::atomic<int> g_requested_threads{0};
std::atomic<bool> g_requested_pin{true};
std::atomic<bool> g_pool_created{false};
std::atomic<int> g_pool_threads{0};

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

int requested_compute_threads() { return g_requested_threads.load(); }

int compute_pool_threads() { return g_pool_threads.load(); }

ThreadPool& compute_pool() {
  static ThreadPool pool = [] {
    // the layout (made before g_pool_created: it reads the requested count), remade where it
    // predates set_compute_threads()
    if (const int n = requested_compute_threads(); n > 0 && numa_layout().n_threads() != n) {
      const NumaOptions o = numa_layout().options();
      STRATA_CHECK(set_numa(o).ok(), "remaking the NUMA layout");
    }
    const NumaLayout& layout = numa_layout();
    g_pool_created.store(true);
    const char* pin_env = std::getenv("STRATA_PIN");
    const bool pin = g_requested_pin.load() && !(pin_env != nullptr && std::strcmp(pin_env, "0") == 0) &&
                     layout.topology().is_this_system();
    g_pool_threads.store(layout.n_threads());
    std::vector<int> cores(size_t(layout.n_threads()));
    for (int i = 0; i < layout.n_threads(); ++i) cores[size_t(i)] = layout.core_of_thread(i);
    const Topology* machine = Topology::machine();
    return ThreadPool(layout.thread_groups(), [pin, cores, machine](int thread) {
      if (pin && machine != nullptr) machine->bind_thread_to_core(cores[size_t(thread)]);
    });
  }();
  return pool;
}

}  // namespace strata::cpu
