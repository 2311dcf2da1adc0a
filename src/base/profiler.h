// Where a forward pass spends its time, by part of the layer: a near-zero-cost recorder (one
// relaxed atomic load per span when off) that accumulates wall time per category on the thread
// that runs the forward pass. `strata bench --profile` prints the split. The kinds are the
// blocks of a layer, not the hardware links of issue #8's profiler, which will build on this.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string_view>

namespace strata::prof {

// attention_core is nested in attention (the softmax(Q K^T) V part, without the projections); the
// others do not overlap.
enum class Part { attention, attention_core, router, experts, shared_ffn, output, count };
inline constexpr std::array<std::string_view, size_t(Part::count)> kPartNames = {
    "attention", "QK/softmax/V", "router", "experts", "shared/dense ffn", "output head"};
inline constexpr bool nested(Part p) { return p == Part::attention_core; }

struct Totals {
  std::array<std::atomic<int64_t>, size_t(Part::count)> ns{};
  std::array<std::atomic<int64_t>, size_t(Part::count)> calls{};
};

inline std::atomic<bool> g_enabled{false};
inline Totals g_totals;

inline void enable(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
inline void reset() {
  for (auto& v : g_totals.ns) v.store(0);
  for (auto& v : g_totals.calls) v.store(0);
}

// Times its scope into `part` when profiling is on.
class Span {
 public:
  explicit Span(Part part) : part_(part), on_(g_enabled.load(std::memory_order_relaxed)) {
    if (on_) t0_ = std::chrono::steady_clock::now();
  }
  ~Span() {
    if (!on_) return;
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - t0_).count();
    g_totals.ns[size_t(part_)].fetch_add(ns, std::memory_order_relaxed);
    g_totals.calls[size_t(part_)].fetch_add(1, std::memory_order_relaxed);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  Part part_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace strata::prof
