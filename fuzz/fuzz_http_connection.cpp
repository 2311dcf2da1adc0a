// libFuzzer target: any bytes as what a client sends on one connection (request line, headers,
// body; keep-alive may put several requests in one input), answered by the real server routes
// (HttpServer::handle_bytes) in front of a scheduler running the bundled tiny model. The first
// byte picks a server with or without an API key. Every response must be a well-formed HTTP
// response with a status below 500, and a JSON body where the content type says JSON; never a
// crash, a hang or a leak.
//
// Generation is bounded by a 48-token context per slot, so an accepted completion costs at most a
// few milliseconds. httplib itself is a shared library (not instrumented): coverage guides the
// fuzzer through strata's handlers, and ASan/UBSan check strata's code.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "model/model.h"
#include "model/model_info.h"
#include "model/tokenizer.h"
#include "server/http_server.h"

namespace {

using namespace strata;

struct Fixture {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tok;
  ModelSummary summary;
  std::unique_ptr<server::Scheduler> scheduler;
  std::unique_ptr<server::HttpServer> open, keyed;

  Fixture() {
    auto m = Model::load(STRATA_SOURCE_DIR "/tests/data/models/qwen3moe/model-Q4_K_M.gguf");
    if (!m) __builtin_trap();
    model = std::move(*m);
    auto t = Tokenizer::from_gguf(model->file());
    if (!t) __builtin_trap();
    tok = std::make_unique<Tokenizer>(std::move(*t));
    summary = *summarize_model(model->file());
    server::SchedulerOptions so;
    so.max_sequences = 2;
    so.max_queue = 4;
    so.ctx = 48;
    scheduler = std::make_unique<server::Scheduler>(*model, *tok, so);
    server::HttpOptions ho;
    ho.max_body = 64 << 10;
    open = std::make_unique<server::HttpServer>(*scheduler, *tok, ChatTemplate::builtin(ChatFormat::chatml), "tiny", summary, ho);
    ho.api_key = "sk-fuzz";
    keyed = std::make_unique<server::HttpServer>(*scheduler, *tok, ChatTemplate::builtin(ChatFormat::chatml), "tiny", summary, ho);
  }
};

// Checks the first response (keep-alive answers may follow; a HEAD answer has no body, so the
// ones after it cannot be split reliably): a status line with a status below 500, a complete
// header, and a JSON body where the content type says JSON. Traps on a bad one.
void check_response(std::string_view out, bool head_request) {
  if (out.empty()) return;  // httplib answers nothing when the connection ends mid-request line
  if (out.substr(0, 9) != "HTTP/1.1 " || out.size() < 12) __builtin_trap();
  const int status = (out[9] - '0') * 100 + (out[10] - '0') * 10 + (out[11] - '0');
  if (status < 100 || status >= 500) __builtin_trap();
  const size_t head_end = out.find("\r\n\r\n");
  if (head_end == std::string_view::npos) __builtin_trap();
  const std::string_view head = out.substr(0, head_end);
  const size_t cl = head.find("Content-Length: ");
  if (head_request || cl == std::string_view::npos) return;  // no body, or chunked (a stream)
  const size_t len = std::strtoull(std::string(head.substr(cl + 16, 20)).c_str(), nullptr, 10);
  const size_t body_at = head_end + 4;
  if (body_at + len > out.size()) __builtin_trap();
  if (head.find("Content-Type: application/json") != std::string_view::npos &&
      !nlohmann::json::accept(out.substr(body_at, len)))
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture f;
  if (size == 0) return 0;
  server::HttpServer& s = (data[0] & 1) ? *f.keyed : *f.open;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  check_response(s.handle_bytes(input), input.substr(0, 4) == "HEAD");
  return 0;
}
