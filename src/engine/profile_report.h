// What `strata profile` writes from the recorder of base/profiler.h: a snapshot of its totals, a
// Chrome / Perfetto trace (JSON "complete" events, one track per link plus one for the tokens),
// and an SVG chart of the time per layer split by part.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/profiler.h"

namespace strata {

struct ProfileSnapshot {
  std::array<int64_t, size_t(prof::Part::count)> part_ns{};
  std::array<int64_t, size_t(prof::Part::count)> part_calls{};
  std::array<int64_t, size_t(prof::Link::count)> link_ns{};
  std::vector<std::array<int64_t, size_t(prof::Part::count)>> layer_ns;  // [layer][part]

  int64_t spans_ns() const;  // the host's non-nested spans: the time the recorder accounts for
  int64_t layer_total_ns(size_t layer) const;  // non-nested parts of one layer
};

// The recorder's totals now, for layers [0, n_layers).
ProfileSnapshot take_snapshot(int n_layers);

// One decode step as the caller timed it, for the token track of the trace.
struct TokenMark {
  int64_t t0_ns = 0;  // prof::now_ns() clock
  int64_t dur_ns = 0;
  int index = 0;
};

// Chrome trace event format (the JSON object form), loadable by ui.perfetto.dev and
// chrome://tracing. Times in microseconds.
std::string chrome_trace_json(const std::vector<prof::Event>& events, const std::vector<TokenMark>& tokens);

// The shares of decode time by link: the host's (CPU compute, NVMe wait, idle: 1 in all) and,
// beside it, each other link's busy share.
struct LinkShares {
  double cpu = 0, nvme_wait = 0, idle = 0;
  double gpu = 0, pcie = 0, nvme_read = 0;
};

// A horizontal stacked bar per layer (ms per token by part), with a legend; self-contained SVG.
// links: bars of the split by link above the layers (none: no such bars).
std::string layer_chart_svg(const ProfileSnapshot& s, int n_tokens, const std::string& title,
                            const LinkShares* links = nullptr);

}  // namespace strata
