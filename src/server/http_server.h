// The OpenAI-compatible HTTP front of the scheduler (docs/server.md): POST /v1/chat/completions
// and /v1/completions (streamed as server-sent events or not), GET /v1/models, /health and
// /metrics (Prometheus text). Every malformed request gets an OpenAI-shaped JSON error with a 4xx
// status; a client that disconnects mid-stream cancels its sequence.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "base/error.h"
#include "model/chat_template.h"
#include "model/model_info.h"
#include "server/scheduler.h"

namespace httplib {
class Server;
}

namespace strata::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: any free port (tests)
  std::string api_key;         // empty: no authentication
  size_t max_body = 4u << 20;  // bytes of a request body
  int http_threads = 32;       // connections served at once (streams hold one each)
};

class HttpServer {
 public:
  HttpServer(Scheduler& scheduler, const Tokenizer& tok, ChatFormat format, std::string model_id,
             const ModelSummary& summary, HttpOptions o);
  ~HttpServer();

  // Binds the socket; returns the port (useful with port 0) or an Error naming host and port.
  Result<int> bind();
  // Serves until stop() (blocks).
  void run();
  void stop();
  // One connection's bytes (request line, headers, body; possibly several requests) answered
  // through the same parser and routes as a socket, without one: the raw response bytes
  // (fuzz/fuzz_http_request.cpp). Blocks until every response is complete.
  std::string handle_bytes(std::string_view input);

 private:
  void routes();
  Scheduler& scheduler_;
  const Tokenizer& tok_;
  const ChatFormat format_;
  const std::string model_id_;
  const ModelSummary summary_;
  const HttpOptions o_;
  const int64_t created_;
  std::unique_ptr<httplib::Server> http_;
};

// A completion request's body, checked: the request (sampling, limits, stop strings; prompt ids
// not yet filled), the prompt text (chat messages formatted with `format`), and the stream flags.
struct ParsedCompletion {
  CompletionRequest request;
  std::string prompt;
  bool stream = false, include_usage = false;
};
// What to answer instead (status 0: the body is fine).
struct RequestError {
  int status = 0;
  std::string message, param;
};
// The body of POST /v1/chat/completions (chat) or /v1/completions. Any bytes: a ParsedCompletion,
// or a 400 with a message naming the field; never a crash (fuzz/fuzz_http_request.cpp).
RequestError parse_completion_body(const std::string& body, bool chat, ChatFormat format, ParsedCompletion& out);

// Constant-time comparison (API keys): the time does not depend on where the strings differ.
bool constant_time_equal(const std::string& a, const std::string& b);

}  // namespace strata::server
