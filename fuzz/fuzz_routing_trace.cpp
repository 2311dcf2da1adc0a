// libFuzzer target: any bytes as a JSONL routing trace (storage/routing_trace.h), then replayed
// through every cache policy and Belady's optimum when it parses. Errors name the line; never a
// crash, and the replay's counts add up.
#include <cstddef>
#include <cstdint>
#include <string>

#include "storage/expert_cache.h"
#include "storage/routing_trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto t = strata::parse_routing_trace(text, "fuzz.jsonl");
  if (!t.ok()) {
    if (t.error().message.find("fuzz.jsonl") == std::string::npos) __builtin_trap();
    return 0;
  }
  if (t->steps.size() > 4096) return 0;  // keep each input fast
  for (strata::CachePolicyKind k : strata::kAllCachePolicies) {
    const strata::ReplayResult r =
        strata::replay_trace(*t, {.kind = k}, {.vram_experts = 1, .ram_experts = 3});
    if (r.total.vram_hits + r.total.ram_hits + r.total.misses != r.total.accesses) __builtin_trap();
  }
  if (strata::belady_hits(*t, 4) > t->n_accesses()) __builtin_trap();
  return 0;
}
