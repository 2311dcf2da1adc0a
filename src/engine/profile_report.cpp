#include "engine/profile_report.h"

#include <algorithm>
#include <span>

#include <algorithm>
#include <cstdio>

namespace strata {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// Parts a layer's bar is made of, with their colours; nested parts are inside their parent.
struct BarPart {
  prof::Part part;
  const char* colour;
};
constexpr BarPart kBarParts[] = {
    {prof::Part::attention, "#4e79a7"},
    {prof::Part::router, "#f28e2b"},
    {prof::Part::experts, "#e15759"},
    {prof::Part::shared_ffn, "#76b7b2"},
};

std::string escape_xml(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

}  // namespace

int64_t ProfileSnapshot::spans_ns() const {
  int64_t t = 0;
  for (size_t p = 0; p < size_t(prof::Part::count); ++p)
    if (!prof::nested(prof::Part(p))) t += part_ns[p];
  return t;
}

int64_t ProfileSnapshot::layer_total_ns(size_t layer) const {
  int64_t t = 0;
  for (size_t p = 0; p < size_t(prof::Part::count); ++p)
    if (!prof::nested(prof::Part(p))) t += layer_ns[layer][p];
  return t;
}

ProfileSnapshot take_snapshot(int n_layers) {
  ProfileSnapshot s;
  for (size_t p = 0; p < size_t(prof::Part::count); ++p) {
    s.part_ns[p] = prof::g_totals.ns[p].load();
    s.part_calls[p] = prof::g_totals.calls[p].load();
  }
  for (size_t k = 0; k < size_t(prof::Link::count); ++k) s.link_ns[k] = prof::g_totals.link_ns[k].load();
  const int n = std::clamp(n_layers, 0, prof::kMaxLayers);
  s.layer_ns.resize(size_t(n));
  for (size_t l = 0; l < size_t(n); ++l)
    for (size_t p = 0; p < size_t(prof::Part::count); ++p) s.layer_ns[l][p] = prof::g_totals.layer_ns[l][p].load();
  return s;
}

std::string chrome_trace_json(const std::vector<prof::Event>& events, const std::vector<TokenMark>& tokens) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  // track names: tid 0 is the token track, tid 1 + link the links
  out += "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\"args\":{\"name\":\"tokens\"}}";
  for (size_t k = 0; k < size_t(prof::Link::count); ++k) {
    out += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(k + 1) +
           ",\"args\":{\"name\":\"" + std::string(prof::kLinkNames[k]) + "\"}}";
  }
  for (const TokenMark& t : tokens) {
    out += ",\n{\"name\":\"token " + std::to_string(t.index) + "\",\"cat\":\"token\",\"ph\":\"X\",\"pid\":1,\"tid\":0,\"ts\":" +
           fmt("%.3f", double(t.t0_ns) / 1e3) + ",\"dur\":" + fmt("%.3f", double(t.dur_ns) / 1e3) + "}";
  }
  for (const prof::Event& e : events) {
    out += ",\n{\"name\":\"" + std::string(prof::kPartNames[size_t(e.part)]) + "\",\"cat\":\"" +
           std::string(prof::kLinkNames[size_t(e.link)]) + "\",\"ph\":\"X\",\"pid\":1,\"tid\":" +
           std::to_string(size_t(e.link) + 1) + ",\"ts\":" + fmt("%.3f", double(e.t0_ns) / 1e3) +
           ",\"dur\":" + fmt("%.3f", double(e.dur_ns) / 1e3);
    if (e.layer >= 0) out += ",\"args\":{\"layer\":" + std::to_string(e.layer) + "}";
    out += "}";
  }
  out += "\n]}\n";
  return out;
}

std::string layer_chart_svg(const ProfileSnapshot& s, int n_tokens, const std::string& title, const LinkShares* links) {
  const size_t n_layers = s.layer_ns.size();
  const double per_token = 1e6 * double(std::max(n_tokens, 1));  // ns -> ms per token
  double max_ms = 0;
  for (size_t l = 0; l < n_layers; ++l) max_ms = std::max(max_ms, double(s.layer_total_ns(l)) / per_token);
  if (max_ms <= 0) max_ms = 1;
  const int left = 60, right = 30, row = 14, bar = 10, width = 800;
  const int link_rows = links != nullptr ? 4 : 0;  // a title, the host's bar, the links' bars
  const int top = 50 + (link_rows > 0 ? link_rows * 18 + 16 : 0);
  const int plot_w = width - left - right;
  const int height = top + int(n_layers) * row + 60;
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(width) + "\" height=\"" +
                    std::to_string(height) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + std::to_string(left) + "\" y=\"20\" font-size=\"14\">" + escape_xml(title) + "</text>\n";
  if (links != nullptr) {
    // the host's bar (CPU, NVMe wait, idle: 100% of the wall) and, under it, each link's busy share
    svg += "<text x=\"" + std::to_string(left) + "\" y=\"40\">split of decode time by link (share of wall time)</text>\n";
    struct Seg {
      const char* name;
      double share;
      const char* colour;
    };
    const Seg host[] = {{"CPU", links->cpu, "#4e79a7"}, {"NVMe wait", links->nvme_wait, "#e15759"}, {"idle", links->idle, "#bab0ac"}};
    const Seg beside[] = {{"GPU", links->gpu, "#59a14f"}, {"PCIe", links->pcie, "#f28e2b"}, {"NVMe read", links->nvme_read, "#b07aa1"}};
    auto bar_row = [&](int y, std::span<const Seg> segs) {
      double x = left;
      for (const Seg& sg : segs) {
        const double w = std::clamp(sg.share, 0.0, 1.0) * plot_w;
        svg += "<rect x=\"" + fmt("%.2f", x) + "\" y=\"" + std::to_string(y) + "\" width=\"" + fmt("%.2f", w) +
               "\" height=\"12\" fill=\"" + sg.colour + "\"><title>" + sg.name + " " + fmt("%.1f", 100 * sg.share) +
               "%</title></rect>\n";
        svg += "<text x=\"" + fmt("%.2f", x + 2) + "\" y=\"" + std::to_string(y + 10) + "\" fill=\"black\">" + sg.name +
               " " + fmt("%.0f", 100 * sg.share) + "%</text>\n";
        x += w;
      }
    };
    bar_row(48, host);
    for (size_t i = 0; i < 3; ++i) bar_row(66 + int(i) * 18, std::span<const Seg>(&beside[i], 1));
  }
  svg += "<text x=\"" + std::to_string(left) + "\" y=\"" + std::to_string(top - 14) +
         "\">time per decoded token by layer and part (ms)</text>\n";
  for (size_t l = 0; l < n_layers; ++l) {
    const int y = top + int(l) * row;
    svg += "<text x=\"" + std::to_string(left - 6) + "\" y=\"" + std::to_string(y + bar) +
           "\" text-anchor=\"end\">" + std::to_string(l) + "</text>\n";
    double x = left;
    for (const BarPart& bp : kBarParts) {
      const double ms = double(s.layer_ns[l][size_t(bp.part)]) / per_token;
      if (ms <= 0) continue;
      const double w = ms / max_ms * plot_w;
      svg += "<rect x=\"" + fmt("%.2f", x) + "\" y=\"" + std::to_string(y) + "\" width=\"" + fmt("%.2f", w) +
             "\" height=\"" + std::to_string(bar) + "\" fill=\"" + bp.colour + "\"><title>layer " + std::to_string(l) +
             " " + std::string(prof::kPartNames[size_t(bp.part)]) + " " + fmt("%.3f", ms) + " ms</title></rect>\n";
      x += w;
    }
  }
  // axis and legend
  const int axis_y = top + int(n_layers) * row + 4;
  svg += "<line x1=\"" + std::to_string(left) + "\" y1=\"" + std::to_string(axis_y) + "\" x2=\"" +
         std::to_string(left + plot_w) + "\" y2=\"" + std::to_string(axis_y) + "\" stroke=\"black\"/>\n";
  for (int k = 0; k <= 4; ++k) {
    const double x = left + plot_w * k / 4.0;
    svg += "<text x=\"" + fmt("%.1f", x) + "\" y=\"" + std::to_string(axis_y + 14) + "\" text-anchor=\"middle\">" +
           fmt("%.3g", max_ms * k / 4.0) + "</text>\n";
  }
  int lx = left;
  const int ly = axis_y + 34;
  for (const BarPart& bp : kBarParts) {
    const std::string name(prof::kPartNames[size_t(bp.part)]);
    svg += "<rect x=\"" + std::to_string(lx) + "\" y=\"" + std::to_string(ly - 9) + "\" width=\"10\" height=\"10\" fill=\"" +
           bp.colour + "\"/><text x=\"" + std::to_string(lx + 14) + "\" y=\"" + std::to_string(ly) + "\">" +
           escape_xml(name) + "</text>\n";
    lx += 30 + int(name.size()) * 7;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace strata
