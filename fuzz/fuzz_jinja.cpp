// libFuzzer target: any bytes as a chat template (jinja/jinja.h), rendered with a chat-shaped
// context. Either a rendering or an error with a message; never a crash, a hang or a runaway
// allocation (the engine's limits on recursion, steps, ranges and output size hold).
#include <cstddef>
#include <cstdint>
#include <string>

#include "jinja/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using strata::jinja::Json;
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto t = strata::jinja::Template::parse(source);
  if (!t.ok()) {
    if (t.error().message.empty()) __builtin_trap();
    return 0;
  }
  static const Json context = {
      {"messages", Json::array({{{"role", "system"}, {"content", "be brief"}},
                                {{"role", "user"}, {"content", "hi é"}},
                                {{"role", "assistant"}, {"content", ""},
                                 {"tool_calls", Json::array({{{"function", {{"name", "f"}, {"arguments", {{"a", 1}}}}}}})}}})},
      {"tools", Json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", Json::object()}}}}})},
      {"add_generation_prompt", true},
      {"bos_token", "<s>"},
      {"eos_token", "</s>"}};
  auto r = t->render(context);
  if (!r.ok() && r.error().message.empty()) __builtin_trap();
  return 0;
}
