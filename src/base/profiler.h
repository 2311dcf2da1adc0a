// Where a forward pass spends its time: a near-zero-cost recorder (one relaxed atomic load per
// span when off). Each span says what ran (the part of the layer), in which layer, and on which
// hardware resource (the link: CPU compute, GPU compute, PCIe each way, NVMe reads and waits).
// Totals accumulate per part, per (layer, part) and per link; with tracing on, every span is also
// kept as an event for a Chrome / Perfetto trace. `strata profile` and `strata bench --profile`
// print them.
//
// The host's spans (Span, below) are CPU compute on the thread that runs the forward pass. The
// tiers record their own links with record(): the NVMe tier each interval with a read in flight
// (nvme_read) and each wait of a compute thread on a read (nvme_wait, summed over the threads),
// the GPU tier the device's work (gpu) and copies (pcie_h2d) as its timeline models them.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <vector>

namespace strata::prof {

// attention_core is nested in attention (the softmax(Q K^T) V part, without the projections); the
// others do not overlap.
// tier_step: the tiers' work between forward passes (the GPU tier's promotions into VRAM).
enum class Part {
  embed, attention, attention_core, router, experts, shared_ffn, output, sample, tier_step, engram, count
};
inline constexpr std::array<std::string_view, size_t(Part::count)> kPartNames = {
    "embed", "attention", "QK/softmax/V", "router", "experts", "shared/dense ffn", "output head", "sampling",
    "tier step (promotions)", "Engram"};
inline constexpr bool nested(Part p) { return p == Part::attention_core; }

enum class Link { cpu, gpu, pcie_h2d, pcie_d2h, nvme_read, nvme_wait, count };
inline constexpr std::array<std::string_view, size_t(Link::count)> kLinkNames = {
    "CPU", "GPU", "PCIe h2d", "PCIe d2h", "NVMe read", "NVMe wait"};

inline constexpr int kMaxLayers = 512;
inline constexpr int kMaxNodes = 64;  // NUMA groups counted apart (more share the last)

struct Event {
  int64_t t0_ns = 0;  // since the recorder's epoch
  int64_t dur_ns = 0;
  Part part = Part::embed;
  Link link = Link::cpu;
  int16_t layer = -1;
};

struct Totals {
  std::array<std::atomic<int64_t>, size_t(Part::count)> ns{};
  std::array<std::atomic<int64_t>, size_t(Part::count)> calls{};
  std::array<std::atomic<int64_t>, size_t(Link::count)> link_ns{};  // non-nested spans only
  // [layer][part]; spans outside a layer (embed, output, sampling) are not here
  std::array<std::array<std::atomic<int64_t>, size_t(Part::count)>, kMaxLayers> layer_ns{};
  // Routed experts computed (distinct per layer and forward pass) and their weight bytes: counted
  // whether or not spans are enabled (one add per MoE layer), for speculative decoding's roofline.
  std::atomic<int64_t> experts_run{0}, expert_bytes{0};
  // Routed-expert weight bytes read by each NUMA group's threads (cpu/numa.h), always counted (one
  // add per row task); a cache line each, so that groups do not share one.
  struct alignas(64) Counter {
    std::atomic<int64_t> v{0};
  };
  std::array<Counter, kMaxNodes> node_bytes{};
};

inline std::atomic<bool> g_enabled{false};
inline std::atomic<bool> g_tracing{false};
inline Totals g_totals;
inline std::mutex g_events_mutex;
inline std::vector<Event> g_events;
inline constexpr size_t kMaxEvents = size_t(4) << 20;  // ~100 MB of trace at most
inline const std::chrono::steady_clock::time_point g_epoch = std::chrono::steady_clock::now();

inline void enable(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
// Tracing keeps every span as an Event (implies enable).
inline void enable_tracing(bool on) {
  g_tracing.store(on, std::memory_order_relaxed);
  if (on) enable(true);
}
inline void reset() {
  for (auto& v : g_totals.ns) v.store(0);
  for (auto& v : g_totals.calls) v.store(0);
  for (auto& v : g_totals.link_ns) v.store(0);
  for (auto& layer : g_totals.layer_ns)
    for (auto& v : layer) v.store(0);
  g_totals.experts_run.store(0);
  g_totals.expert_bytes.store(0);
  for (auto& c : g_totals.node_bytes) c.v.store(0);
}
inline void count_experts(int64_t n, int64_t bytes) {
  g_totals.experts_run.fetch_add(n, std::memory_order_relaxed);
  g_totals.expert_bytes.fetch_add(bytes, std::memory_order_relaxed);
}
inline void count_node_bytes(int group, int64_t bytes) {
  g_totals.node_bytes[size_t(group < kMaxNodes ? group : kMaxNodes - 1)].v.fetch_add(bytes, std::memory_order_relaxed);
}
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - g_epoch).count();
}
inline std::vector<Event> take_events() {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  std::vector<Event> out;
  out.swap(g_events);
  return out;
}

// A span timed elsewhere, on `link` (not CPU compute): into the link's total and, with tracing, the
// trace; the parts' totals are the host's spans alone. Any thread.
inline void record(Part part, int layer, Link link, int64_t t0_ns, int64_t dur_ns) {
  if (!g_enabled.load(std::memory_order_relaxed) || dur_ns <= 0) return;
  g_totals.link_ns[size_t(link)].fetch_add(dur_ns, std::memory_order_relaxed);
  if (g_tracing.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(g_events_mutex);
    if (g_events.size() < kMaxEvents) g_events.push_back({t0_ns, dur_ns, part, link, int16_t(layer)});
  }
}
inline bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

// Times its scope into `part` (of `layer`, on `link`) when profiling is on.
class Span {
 public:
  explicit Span(Part part, int layer = -1, Link link = Link::cpu)
      : part_(part), link_(link), layer_(layer), on_(g_enabled.load(std::memory_order_relaxed)) {
    if (on_) t0_ = now_ns();
  }
  ~Span() {
    if (!on_) return;
    const int64_t ns = now_ns() - t0_;
    g_totals.ns[size_t(part_)].fetch_add(ns, std::memory_order_relaxed);
    g_totals.calls[size_t(part_)].fetch_add(1, std::memory_order_relaxed);
    if (!nested(part_)) g_totals.link_ns[size_t(link_)].fetch_add(ns, std::memory_order_relaxed);
    if (layer_ >= 0 && layer_ < kMaxLayers)
      g_totals.layer_ns[size_t(layer_)][size_t(part_)].fetch_add(ns, std::memory_order_relaxed);
    if (g_tracing.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> lock(g_events_mutex);
      if (g_events.size() < kMaxEvents) g_events.push_back({t0_, ns, part_, link_, int16_t(layer_)});
    }
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  Part part_;
  Link link_;
  int layer_;
  bool on_;
  int64_t t0_ = 0;
};

}  // namespace strata::prof
