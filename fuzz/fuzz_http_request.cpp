// libFuzzer target: any bytes as the body of POST /v1/chat/completions and /v1/completions
// (server/http_server.h parse_completion_body, what the server runs before tokenizing). Either a
// request whose fields are inside their documented ranges, or a 400 with a message; never a crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/http_server.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {true, false}) {
    for (strata::ChatFormat format : {strata::ChatFormat::qwen3, strata::ChatFormat::harmony, strata::ChatFormat::raw}) {
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
