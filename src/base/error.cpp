#include "base/error.h"

#include <cstdarg>
#include <cmath>
#include <cstdio>

namespace strata {

bool StickyError::keep(const Status& s) {
  if (s.ok()) return true;
  if (!failed_) {
    failed_ = true;
    message_ = s.error().message;
    std::fprintf(stderr, "strata: %s: %s; %s\n", who_, message_.c_str(), then_);
  }
  return false;
}

std::string strfmt(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1000.0 && u < 6) {
    v /= 1000.0;
    ++u;
  }
  if (u == 0) return strfmt("%.0f B", v);
  return strfmt(v < 10 ? "%.2f %s" : (v < 100 ? "%.1f %s" : "%.0f %s"), v, units[u]);
}

std::string format_size(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace strata
