// The compute pool (cpu/thread_pool.h): every task runs exactly once per run, on a thread index in
// range, with the caller taking part; nested runs are serial; many short runs in a row (the pattern
// of a decode step) and runs from several threads at once lose nothing; grouped runs (NUMA) run
// each group's tasks on that group's threads only.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "cpu/thread_pool.h"

namespace strata {
namespace {

TEST(ThreadPool, EveryTaskRunsOnceOnAThreadInRange) {
  for (int n_threads : {1, 2, 3, 4}) {
    cpu::ThreadPool pool(n_threads, /*pin=*/false);
    EXPECT_EQ(pool.size(), n_threads);
    for (int64_t n_tasks : {0, 1, 2, 7, 64, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n_tasks));
      std::atomic<bool> bad_thread{false};
      pool.run(n_tasks, [&](int64_t t, int thread) {
        runs[size_t(t)].fetch_add(1);
        if (thread < 0 || thread >= n_threads) bad_thread = true;
      });
      for (int64_t t = 0; t < n_tasks; ++t)
        ASSERT_EQ(runs[size_t(t)].load(), 1) << "task " << t << " of " << n_tasks << ", " << n_threads << " threads";
      EXPECT_FALSE(bad_thread);
    }
  }
}

TEST(ThreadPool, ManyShortRunsInARow) {
  cpu::ThreadPool pool(3, false);
  int64_t expected = 0;
  std::atomic<int64_t> sum{0};
  for (int run = 0; run < 100000; ++run) {
    const int64_t n = 1 + run % 5;
    pool.run(n, [&](int64_t t, int) { sum.fetch_add(t + 1); });
    expected += n * (n + 1) / 2;
  }
  EXPECT_EQ(sum.load(), expected);
}

TEST(ThreadPool, NestedRunIsSerialOnTheCallingThread) {
  cpu::ThreadPool pool(2, false);
  std::atomic<int64_t> inner{0};
  std::atomic<bool> wrong_thread{false};
  pool.run(8, [&](int64_t, int thread) {
    pool.run(5, [&](int64_t, int inner_thread) {
      if (inner_thread != thread) wrong_thread = true;
      inner.fetch_add(1);
    });
  });
  EXPECT_EQ(inner.load(), 40);
  EXPECT_FALSE(wrong_thread);
}

TEST(ThreadPool, RunsFromSeveralThreadsAreSerialised) {
  cpu::ThreadPool pool(2, false);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&] {
      for (int i = 0; i < 500; ++i) pool.run(4, [&](int64_t, int) { total.fetch_add(1); });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 500 * 4);
}

TEST(ThreadPool, IdleWorkersSleepAndWakeUp) {
  cpu::ThreadPool pool(2, false);
  std::atomic<int> n{0};
  pool.run(4, [&](int64_t, int) { n.fetch_add(1); });
  // long enough for the worker to stop spinning and sleep on the futex
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  pool.run(4, [&](int64_t, int) { n.fetch_add(1); });
  EXPECT_EQ(n.load(), 8);
}

TEST(ThreadPool, PhysicalCoresIsPositive) { EXPECT_GE(cpu::physical_cores(), 1); }

// Grouped runs: every task once, on a thread of its group, with plain runs and regroupings between.
TEST(ThreadPool, GroupedTasksRunOnlyOnTheirGroupsThreads) {
  cpu::ThreadPool pool({0, 0, 1, 1}, nullptr);
  ASSERT_EQ(pool.n_groups(), 2);
  auto check = [&](const std::vector<int64_t>& starts) {
    std::vector<std::atomic<int>> runs(size_t(starts.back()));
    std::atomic<int> wrong{0};
    pool.run_grouped(starts, [&](int64_t t, int thread) {
      runs[size_t(t)].fetch_add(1);
      const int g = int(std::upper_bound(starts.begin(), starts.end(), t) - starts.begin()) - 1;
      if (pool.group_of(thread) != g) wrong.fetch_add(1);
    });
    for (auto& r : runs) ASSERT_EQ(r.load(), 1);
    EXPECT_EQ(wrong.load(), 0);
  };
  for (int i = 0; i < 2000; ++i) {
    check({0, 1 + i % 7, 1 + i % 7 + i % 11});
    check({0, 0, 5});  // a group without tasks
    std::atomic<int64_t> sum{0};
    pool.run(1 + i % 9, [&](int64_t t, int) { sum.fetch_add(t + 1); });
    const int64_t n = 1 + i % 9;
    ASSERT_EQ(sum.load(), n * (n + 1) / 2);
  }
  pool.set_groups({0, 1, 2, 3});
  ASSERT_EQ(pool.n_groups(), 4);
  for (int i = 0; i < 500; ++i) check({0, 3, 3 + i % 5, 9, 12 + i % 4});
  pool.set_groups({0, 1, 1, 0});
  for (int i = 0; i < 500; ++i) check({0, 4 + i % 3, 10});
}

}  // namespace
}  // namespace strata
