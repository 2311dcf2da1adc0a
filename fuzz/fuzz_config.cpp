// libFuzzer target: any bytes as a TOML config file (engine/config.h parse_config), and as the
// value of a --set override. Either a Config or an error naming the file; never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto c = strata::parse_config(text, "fuzz.toml");
  if (!c.ok() && c.error().message.empty()) __builtin_trap();
  // the same bytes as a --set argument, and as the value of a few keys
  auto ov = strata::parse_override(text);
  if (!ov.ok() && ov.error().message.empty()) __builtin_trap();
  for (const char* key : {"budgets.ram", "cpu.threads", "storage.cache_policy", "model.load"}) {
    auto o = strata::parse_config("", "fuzz.toml", {{key, text}});
    if (!o.ok() && o.error().message.empty()) __builtin_trap();
  }
  return 0;
}
