// libFuzzer target: any bytes as the body of POST /v1/chat/completions and /v1/completions
// (server/http_server.h parse_completion_body, what the server runs before tokenizing). Either a
// request whose fields are inside their documented ranges, or a 400 with a message; never a crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "server/http_server.h"

namespace {
// Built-in formats and a Jinja template that reads tools, tool calls and raises on a role.
std::vector<strata::ChatTemplate> templates() {
  std::vector<strata::ChatTemplate> t;
  for (strata::ChatFormat f : {strata::ChatFormat::qwen3, strata::ChatFormat::harmony, strata::ChatFormat::raw})
    t.push_back(strata::ChatTemplate::builtin(f));
  t.push_back(*strata::ChatTemplate::from_source(
      "{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('system first') }}"
      "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>"
      "{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}{% if tools %}{{ tools | tojson }}"
      "{% endif %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}",
      "<s>", "</s>"));
  return t;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<strata::ChatTemplate> kTemplates = templates();
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {true, false}) {
    for (const strata::ChatTemplate& format : kTemplates) {
      strata::server::ParsedCompletion p;
      const strata::server::RequestError e = strata::server::parse_completion_body(body, chat, format, p);
      if (e.status == 0) {
        const auto& s = p.request.sampling;
        if (!(s.temperature >= 0 && s.temperature <= 2) || !(s.top_p >= 0 && s.top_p <= 1)) __builtin_trap();
        if (p.request.max_tokens < 1 || p.request.stop.size() > 4) __builtin_trap();
      } else if (e.status != 400 || e.message.empty()) {
        __builtin_trap();
      }
      if (!chat) break;  // the format matters for chat only
    }
  }
  return 0;
}
